package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// A lone deferred commit, the common case at low load, is sent as one
// statement rather than a pipeline of three (IdempotencyKeyClaimLone): the
// claim's insert, the operation's one write and the peek, as CTEs of one
// statement. The write's guard, as Guard writes it, is rewritten to ask the
// claim CTE whether it inserted the key row (a sibling CTE's row is
// invisible to the rest of the statement), and its parameters are numbered
// after the claim's. A write that does not fit (several writes, a guard
// written otherwise, SQL the rewrite cannot read safely) is sent in the
// pipeline as before: the single statement only ever saves work.

// writePlaceholder is the CTE of IdempotencyKeyClaimLone that stands for
// the operation's write.
const writePlaceholder = "pgstore_write AS (\n    SELECT 1\n)"

// loneWrite is one write rewritten for IdempotencyKeyClaimLone, the same
// for every write of the same SQL.
type loneWrite struct {
	sql string // the whole statement, the write in its CTE
	// keep are the write's arguments, by index, in their new order (the
	// guard's are dropped unless the write uses them elsewhere); scope, key
	// and at are the guard's, checked against the claim's.
	keep           []int
	scope, key, at int
}

// loneWrites caches the rewriting of each write's SQL: a *loneWrite, or nil
// when it does not fit.
type loneWrites struct {
	claim string // IdempotencyKeyClaimLone, renamed for the table
	guard *regexp.Regexp
	done  sync.Map
}

func newLoneWrites(table, claim string) *loneWrites {
	return &loneWrites{claim: claim, guard: regexp.MustCompile(`(?i)EXISTS\s*\(\s*SELECT\s+1\s+FROM\s+` + table +
		`\s+k\s+WHERE\s+k\.scope\s*=\s*\$(\d+)\s+AND\s+k\.idempotency_key\s*=\s*\$(\d+)\s+AND\s+k\.xmin\s*=\s*pg_current_xact_id_if_assigned\(\)::xid` +
		`\s+AND\s+k\.created_at\s*=\s*\$(\d+)\s*\)`)}
}

// of returns the rewriting of sql, or nil when it does not fit; "" is no
// write at all.
func (w *loneWrites) of(sql string) *loneWrite {
	if sql == "" {
		return &loneWrite{sql: w.claim}
	}
	if v, ok := w.done.Load(sql); ok {
		return v.(*loneWrite)
	}
	lw := w.rewrite(sql)
	w.done.Store(sql, lw)
	return lw
}

// claimParams is the number of IdempotencyKeyClaimLone's own parameters.
const claimParams = 11

func (w *loneWrites) rewrite(sql string) *loneWrite {
	sql = strings.TrimRight(strings.TrimSpace(sql), ";")
	if !strings.Contains(w.claim, writePlaceholder) {
		return nil
	}
	guards := w.guard.FindAllStringSubmatchIndex(sql, -1)
	if len(guards) != 1 || !startsWithWrite(sql) || strings.Contains(strings.ToLower(sql), "pgstore_") {
		return nil
	}
	g := guards[0]
	scope, _ := strconv.Atoi(sql[g[2]:g[3]])
	key, _ := strconv.Atoi(sql[g[4]:g[5]])
	at, _ := strconv.Atoi(sql[g[6]:g[7]])
	body := sql[:g[0]] + "EXISTS (SELECT 1 FROM pgstore_claim)" + sql[g[1]:]
	params, ok := parameters(body)
	if !ok {
		return nil
	}
	lw := &loneWrite{scope: scope - 1, key: key - 1, at: at - 1}
	renumber := map[int]int{}
	params = slices.Compact(slices.Sorted(slices.Values(params)))
	for _, p := range params {
		renumber[p] = claimParams + len(lw.keep) + 1
		lw.keep = append(lw.keep, p-1)
	}
	var out strings.Builder
	last := 0
	forEachParameter(body, func(start, end, n int) {
		out.WriteString(body[last:start])
		out.WriteString("$" + strconv.Itoa(renumber[n]))
		last = end
	})
	out.WriteString(body[last:])
	lw.sql = strings.Replace(w.claim, writePlaceholder, "pgstore_write AS (\n"+out.String()+"\n)", 1)
	return lw
}

// args returns the write's arguments for the statement, or false if its
// guard is not for the claim (it is then sent in the pipeline, where its
// guard is checked as written).
func (lw *loneWrite) args(write []any, claim idempotency.Ref) ([]any, bool) {
	if max(lw.scope, lw.key, lw.at) >= len(write) {
		return nil, false
	}
	s, ok1 := write[lw.scope].([]byte)
	k, ok2 := write[lw.key].(string)
	at, ok3 := write[lw.at].(time.Time)
	if !ok1 || !ok2 || !ok3 || string(s) != claim.Scope || k != claim.Key || !at.Equal(claim.ClaimedAt) {
		return nil, false
	}
	out := make([]any, 0, len(lw.keep))
	for _, i := range lw.keep {
		if i >= len(write) {
			return nil, false
		}
		out = append(out, write[i])
	}
	return out, true
}

// startsWithWrite reports whether sql, past its comments, is an INSERT,
// UPDATE or DELETE: a statement a CTE may hold.
func startsWithWrite(sql string) bool {
	for {
		sql = strings.TrimSpace(sql)
		if !strings.HasPrefix(sql, "--") {
			break
		}
		nl := strings.IndexByte(sql, '\n')
		if nl < 0 {
			return false
		}
		sql = sql[nl:]
	}
	word, _, _ := strings.Cut(sql, " ")
	word = strings.ToUpper(strings.TrimSpace(word))
	return word == "INSERT" || word == "UPDATE" || word == "DELETE"
}

// parameters lists the parameter numbers sql refers to, or false when sql
// holds what forEachParameter cannot read safely.
func parameters(sql string) (params []int, ok bool) {
	ok = forEachParameter(sql, func(_, _, n int) { params = append(params, n) })
	return params, ok
}

// forEachParameter calls f with the position and number of every $n in sql
// outside its comments, string literals and quoted identifiers. It gives up
// (false) on what it does not read: dollar-quoted strings, escape strings
// and block comments.
func forEachParameter(sql string, f func(start, end, n int)) bool {
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			nl := strings.IndexByte(sql[i:], '\n')
			if nl < 0 {
				return true
			}
			i += nl
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			return false
		case c == '\'' || c == '"':
			if c == '\'' && i > 0 && (sql[i-1] == 'e' || sql[i-1] == 'E') {
				return false
			}
			end := strings.IndexByte(sql[i+1:], c)
			if end < 0 {
				return false
			}
			i += end + 1 // a doubled quote reads as two literals
		case c == '$':
			if i > 0 && identifierByte(sql[i-1]) {
				return false // a $ inside an identifier
			}
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			if j == i+1 {
				return false
			}
			n, _ := strconv.Atoi(sql[i+1 : j])
			f(i, j, n)
			i = j - 1
		}
	}
	return true
}

// identifierByte reports whether c may be part of an unquoted identifier.
func identifierByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || ('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

// loneOf returns what a member's commit is as one statement: its write
// rewritten (or none) and that write's arguments, or false when its writes
// do not fit one statement.
func (g *groupCommitter) loneOf(m *member) (*loneWrite, []any, bool) {
	queued := m.lease.writes.queued.QueuedQueries
	switch len(queued) {
	case 0:
		return g.lone.of(""), nil, true
	case 1:
		lw := g.lone.of(queued[0].SQL)
		if lw == nil {
			return nil, nil, false
		}
		write, ok := lw.args(queued[0].Arguments, m.lease.ref)
		return lw, write, ok
	}
	return nil, nil, false
}

// loneParams are the claim's own parameters of a member's statement.
func loneParams(l *deferredLease) keydb.IdempotencyKeyClaimLoneParams {
	req := l.req
	return keydb.IdempotencyKeyClaimLoneParams{
		Scope: []byte(req.Scope), IdempotencyKey: req.Key, LockTimeout: strconv.FormatInt(waitMillis(req.Wait), 10),
		Fingerprint: req.Fingerprint[:], RequestMethod: req.Method, RequestRoute: req.Route,
		ResponseStatus: l.status, ResponseHeaders: l.headers, ResponseBody: l.body,
		CreatedAt: l.ref.ClaimedAt, ExpiresAt: l.ref.ClaimedAt.Add(req.TTL),
	}
}

// loneAnswer is what a member's statement's row means for it.
func loneAnswer(l *deferredLease, row keydb.IdempotencyKeyClaimLoneRow) error {
	return l.answer(claimResult{inserted: row.Claimed, peeked: keydb.IdempotencyKeyPeekManyRow{
		Scope: []byte(l.req.Scope), IdempotencyKey: l.req.Key,
		Fingerprint: row.Fingerprint, Status: row.Status, ResponseStatus: row.ResponseStatus,
		ResponseHeaders: row.ResponseHeaders, ResponseBody: row.ResponseBody,
		CreatedAt: row.CreatedAt, ExpiresAt: row.ExpiresAt, Expired: row.Expired,
	}})
}

// sendLone sends a lone member's claim and its one write (or none) as one
// statement, and reports false, having sent nothing, when its write does
// not fit it.
func (g *groupCommitter) sendLone(ctx context.Context, m *member) bool {
	lw, write, ok := g.loneOf(m)
	if !ok {
		return false
	}
	if g.sent != nil {
		g.sent(1)
	}
	// The connection is had under the request's deadline, not the
	// statement's: waiting for one says nothing of the key, and a pool
	// exhausted for longer than the wait must not pass for a key in
	// flight.
	conn, err := g.pool.Acquire(ctx)
	if err != nil {
		m.err = Translate(fmt.Errorf("claim: acquire a connection: %w", err))
		return true
	}
	defer conn.Release()
	// The whole statement is bounded as a pipeline's statements are, by
	// the wait and its slack (see Claim).
	stmtCtx, cancel := context.WithTimeout(ctx, m.lease.req.Wait+statementSlack)
	defer cancel()
	row, err := keydb.New(withWrite{conn, lw, write}).IdempotencyKeyClaimLone(stmtCtx, loneParams(m.lease))
	switch {
	case err != nil && ctx.Err() == nil && stmtCtx.Err() != nil:
		// The statement's own bound ran out, not the request's, and no
		// lock wait for the key's holder did first (its lock_timeout is
		// shorter): the server was too slow to say.
		m.err = fmt.Errorf("%w: the claim took longer than its wait budget: %w", idempotency.ErrUnavailable, err)
	case err != nil:
		m.err = claimError(ctx, g.store.table, "claim", err)
	default:
		m.err = loneAnswer(m.lease, row)
	}
	return true
}

// sendLones sends a few members as one pipeline of their lone statements,
// one transaction, and reports false, having sent nothing, when a member's
// writes do not fit its statement. Each statement claims, writes and peeks
// for its own member alone, so a short pipeline costs PostgreSQL fewer
// statements than the merged claims' two and the members' writes.
func (g *groupCommitter) sendLones(members []*member) bool {
	// Queued, not run; nothing is sent unless every member fits.
	p := &queue{}
	var wait time.Duration
	for _, m := range members {
		lw, write, ok := g.loneOf(m)
		if !ok {
			return false
		}
		wait = max(wait, m.lease.req.Wait)
		_, _ = keydb.New(withWrite{p, lw, write}).IdempotencyKeyClaimLone(context.Background(), loneParams(m.lease))
	}
	if g.sent != nil {
		g.sent(len(members))
	}
	ctx, cancel := mergedContext(members)
	defer cancel()
	conn, err := g.pool.Acquire(ctx)
	if err != nil {
		for _, m := range members {
			m.err = errSendAlone
		}
		return true
	}
	defer conn.Release()
	stmtCtx, cancelStmt := context.WithTimeout(ctx, wait+statementSlack)
	defer cancelStmt()
	br := conn.SendBatch(stmtCtx, &p.batch)
	rows := make([]keydb.IdempotencyKeyClaimLoneRow, len(members))
	failed, failure := -1, error(nil)
	for i := range members {
		// The generated method only scans here: batchRow ignores the
		// statement and its arguments and reads the next result.
		row, err := keydb.New(batchRow{br}).IdempotencyKeyClaimLone(stmtCtx, keydb.IdempotencyKeyClaimLoneParams{})
		if err != nil {
			failed, failure = i, err
			break
		}
		rows[i] = row
	}
	closeErr := br.Close()
	for i, m := range members {
		switch {
		case failure == nil && closeErr == nil:
			m.err = loneAnswer(m.lease, rows[i])
		case i == failed && stmtCtx.Err() == nil && ownFailure(ctx, failure):
			// Its own statement failed for a reason of its own: the answer
			// it would have got alone; the others go again alone.
			m.err = claimError(m.ctx, g.store.table, "claim", failure)
		default:
			m.err = errSendAlone
		}
	}
	return true
}

// batchRow reads the next result of a pipeline as the row of the query
// the generated method would have run.
type batchRow struct{ br pgx.BatchResults }

func (b batchRow) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return b.br.Exec()
}

func (b batchRow) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return b.br.Query()
}

func (b batchRow) QueryRow(context.Context, string, ...any) pgx.Row {
	return b.br.QueryRow()
}

// withWrite runs IdempotencyKeyClaimLone as rewritten for its write (and
// for the store's table), with the write's arguments after the claim's.
type withWrite struct {
	db    keydb.DBTX
	write *loneWrite
	args  []any
}

var errNotLone = errors.New("pgstore: only IdempotencyKeyClaimLone runs with a write")

func (w withWrite) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotLone
}

func (w withWrite) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errNotLone
}

func (w withWrite) QueryRow(ctx context.Context, _ string, args ...any) pgx.Row {
	if len(args) != claimParams {
		return errRow{fmt.Errorf("pgstore: %d arguments to the lone claim, want %d", len(args), claimParams)}
	}
	return w.db.QueryRow(ctx, w.write.sql, append(args, w.args...)...)
}

// claimLoneSQL is IdempotencyKeyClaimLone's SQL as the store sends it,
// renamed for its table: queued, never sent.
func claimLoneSQL(s *Store) string {
	p := &queue{}
	_, _ = s.queries(p).IdempotencyKeyClaimLone(context.Background(), keydb.IdempotencyKeyClaimLoneParams{})
	return p.batch.QueuedQueries[0].SQL
}
