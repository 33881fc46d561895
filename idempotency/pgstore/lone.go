package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// A lone commit (a claim at commit sent alone, not merged with others), the
// common case at low load, is sent as one statement rather than a pipeline
// of three (IdempotencyKeyClaimLone): the claim's insert, the operation's
// one write and the peek, as CTEs of one statement. The relation that the
// write's guard call is replaced by a test of (claimed) is a CTE of that
// statement that asks the claim's insert whether it inserted the key row
// (a sibling CTE's row is invisible to the rest of the statement); the
// write goes, its guard replaced, in the CTE pgstore_write, and the claim's
// own parameters are numbered after the write's. Several writes go in the
// pipeline.

// writePlaceholder is the CTE of IdempotencyKeyClaimLone that stands for
// the operation's write.
const writePlaceholder = "pgstore_write AS (\n    SELECT 1\n)"

// loneSlack is how long a lone commit's statement may take beyond its
// wait. PostgreSQL cannot bound that statement (see IdempotencyKeyClaimLone),
// so a deadline on the client is what ends the wait for a server that
// stopped answering. Unlike statementSlack, which PostgreSQL measures on its
// own clock, it also counts the round trip, the statement's preparation on
// a new connection and a busy machine's scheduling, and a slow answer must
// not pass for an outage. The price is a looser bound on a lone commit that
// waits behind several holders in turn (each wait is still bounded).
const loneSlack = 2 * time.Second

// claimParams is the number of IdempotencyKeyClaimLone's own parameters.
const claimParams = 11

// lone is the statement of a lone commit of the write sql with n
// arguments, or of none ("").
func (s *Store) lone(sql string, n int) string {
	if sql == "" {
		return s.claimLone
	}
	key := composedKey{sql: sql, n: n}
	if v, ok := s.lones.Load(key); ok {
		return v.(string)
	}
	var out strings.Builder
	last := 0
	forEachParameter(s.claimLone, func(start, end, k int) {
		out.WriteString(s.claimLone[last:start])
		out.WriteString("$" + strconv.Itoa(n+k))
		last = end
	})
	out.WriteString(s.claimLone[last:])
	stmt := strings.Replace(out.String(), writePlaceholder, "pgstore_write AS (\n"+sql+"\n)", 1)
	s.lones.Store(key, stmt)
	return stmt
}

// checkClaimLone makes sure that IdempotencyKeyClaimLone, as generated,
// has the write's place and parameters that lone can renumber.
func checkClaimLone(sql string) error {
	params := 0
	ok := forEachParameter(sql, func(_, _, _ int) { params++ })
	if !ok || params == 0 || !strings.Contains(sql, writePlaceholder) {
		return errors.New("pgstore: IdempotencyKeyClaimLone has no place for a write")
	}
	return nil
}

// startsWithWrite reports whether sql, past its comments, is an INSERT,
// UPDATE or DELETE: a statement a CTE may hold.
func startsWithWrite(sql string) bool {
	for {
		sql = strings.TrimSpace(sql)
		var end int
		switch {
		case strings.HasPrefix(sql, "--"):
			end = strings.IndexByte(sql, '\n')
		case strings.HasPrefix(sql, "/*"):
			if end = strings.Index(sql, "*/"); end >= 0 {
				end += len("*/")
			}
		default:
			word := sql
			if i := strings.IndexFunc(sql, unicode.IsSpace); i >= 0 {
				word = sql[:i]
			}
			word = strings.ToUpper(word)
			return word == "INSERT" || word == "UPDATE" || word == "DELETE"
		}
		if end < 0 {
			return false
		}
		sql = sql[end:]
	}
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

// loneOf returns a member's commit as one statement and its write's
// arguments, or false when it has more writes than one statement holds.
func (g *groupCommitter) loneOf(m *member) (sql string, write []any, ok bool) {
	switch ws := m.lease.writes.writes; len(ws) {
	case 0:
		return g.store.lone("", 0), nil, true
	case 1:
		return g.store.lone(ws[0].sql, len(ws[0].args)), ws[0].args, true
	}
	return "", nil, false
}

// loneParams are the claim's own parameters of a member's statement.
func loneParams(l *deferredLease) keydb.IdempotencyKeyClaimLoneParams {
	req := l.req
	return keydb.IdempotencyKeyClaimLoneParams{
		Scope: []byte(l.scope), IdempotencyKey: req.Key, LockTimeout: strconv.FormatInt(waitMillis(req.Wait), 10),
		Fingerprint: req.Fingerprint[:], RequestMethod: req.Method, RequestRoute: req.Route,
		ResponseStatus: l.status, ResponseHeaders: l.headers, ResponseBody: l.body,
		CreatedAt: l.ref.ClaimedAt, TtlSeconds: req.TTL.Seconds(),
	}
}

// loneAnswer is what a member's statement's row means for it.
func loneAnswer(l *deferredLease, row keydb.IdempotencyKeyClaimLoneRow) error {
	return l.answer(claimResult{inserted: row.Claimed, peeked: keydb.IdempotencyKeyPeekManyRow{
		Scope: []byte(l.scope), IdempotencyKey: l.req.Key,
		Fingerprint: row.Fingerprint, Status: row.Status, ResponseStatus: row.ResponseStatus,
		ResponseHeaders: row.ResponseHeaders, ResponseBody: row.ResponseBody,
		ResponsePieces: row.ResponsePieces, ResponseSize: row.ResponseSize,
		CreatedAt: row.CreatedAt, ExpiresAt: row.ExpiresAt, Expired: row.Expired, ReadAt: row.ReadAt,
	}})
}

// sendLone sends a lone member's claim and its one write (or none) as one
// statement, and reports false, having sent nothing, when its write does
// not fit it.
func (g *groupCommitter) sendLone(ctx context.Context, m *member) bool {
	stmt, write, ok := g.loneOf(m)
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
	stmtCtx, cancel := context.WithTimeout(ctx, m.lease.req.Wait+loneSlack)
	defer cancel()
	row, err := keydb.New(withWrite{conn, stmt, write}).IdempotencyKeyClaimLone(stmtCtx, loneParams(m.lease))
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
		stmt, write, ok := g.loneOf(m)
		if !ok {
			return false
		}
		wait = max(wait, m.lease.req.Wait)
		_, _ = keydb.New(withWrite{p, stmt, write}).IdempotencyKeyClaimLone(context.Background(), loneParams(m.lease))
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
	stmtCtx, cancelStmt := context.WithTimeout(ctx, wait+loneSlack)
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

// withWrite runs IdempotencyKeyClaimLone as lone composed it with its
// write (for the store's table), the write's arguments before the claim's.
type withWrite struct {
	db    keydb.DBTX
	stmt  string
	write []any
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
	return w.db.QueryRow(ctx, w.stmt, slices.Concat(w.write, args)...)
}

// claimLoneSQL is IdempotencyKeyClaimLone's SQL as the store sends it,
// rewritten for its table: queued, never sent.
func claimLoneSQL(s *Store) string {
	p := &queue{}
	_, _ = s.queries(p).IdempotencyKeyClaimLone(context.Background(), keydb.IdempotencyKeyClaimLoneParams{})
	return p.batch.QueuedQueries[0].SQL
}
