package testdb

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

// FreshPartitioned is Fresh with the key table's scope column of type
// scope, and every per-account table hash-partitioned by its account
// (schema/variants/partitioned_by_account.sql), as a database sharded by
// account would hold them.
func FreshPartitioned(t testing.TB, scope pgstore.ScopeType) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	dbURL, pool = Empty(t)
	if err := postgres.MigrateKeys(t.Context(), pool, pgstore.Options{Scope: scope}); err != nil {
		t.Fatalf("testdb: migrate: %v", err)
	}
	_, here, _, _ := runtime.Caller(0)
	sql, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "schema", "variants", "partitioned_by_account.sql"))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if _, err := pool.Exec(context.Background(), string(sql)); err != nil {
		t.Fatalf("testdb: partition the schema: %v", err)
	}
	return dbURL, pool
}

// Statements records every SQL statement run through a pool, with its
// arguments: a pgx tracer (postgres.WithQueryTracer).
type Statements struct {
	mu   sync.Mutex
	seen map[string][]any // SQL → the arguments it last ran with
}

// TraceQueryStart implements pgx.QueryTracer.
func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.add(data.SQL, data.Args)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (s *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (s *Statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		s.add(q.SQL, q.Arguments)
	}
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (s *Statements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (s *Statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (s *Statements) add(sql string, args []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string][]any{}
	}
	s.seen[sql] = args
}

// PartitionsTouched explains every recorded statement that reads or
// writes a partitioned table as a generic plan, the one a prepared
// statement settles on, where the account is a parameter rather than a
// constant: each is prepared (PREPARE, as pgx prepares it) and explained
// as EXPLAIN EXECUTE with its recorded arguments under plan_cache_mode =
// force_generic_plan. (EXPLAIN of the statement itself with bound
// arguments plans with their values filled in, which proves nothing about
// the generic plan.) It returns how many it explained and, for each
// statement whose plan keeps more than one partition of a table, its name
// and how many. A plan that prunes to one partition at executor start
// keeps one; an INSERT routes each row to its partition and keeps none.
func (s *Statements) PartitionsTouched(t testing.TB, pool *pgxpool.Pool) (checked int, wide []string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer conn.Release()
	parents := map[string]bool{}
	rows, err := conn.Query(ctx, "SELECT relname FROM pg_class WHERE relkind = 'p'")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	for _, n := range names {
		parents[n] = true
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode") }()

	s.mu.Lock()
	statements := make(map[string][]any, len(s.seen))
	for sql, args := range s.seen {
		statements[sql] = args
	}
	s.mu.Unlock()
	sqls := make([]string, 0, len(statements))
	for sql := range statements {
		sqls = append(sqls, sql)
	}
	slices.Sort(sqls)
	for _, sql := range sqls {
		if !touchesAny(sql, parents) || !explainable(sql) {
			continue
		}
		plan, err := explainGeneric(ctx, conn.Conn(), fmt.Sprintf("touched_%d", checked), sql, statements[sql])
		if err != nil {
			t.Errorf("testdb: explain the generic plan of %s: %v", oneLine(sql), err)
			continue
		}
		checked++
		for table, n := range scans(plan, parents) {
			if n > 1 {
				wide = append(wide, fmt.Sprintf("%s: %d partitions of %s", name(sql), n, table))
			}
		}
	}
	return checked, wide
}

// explainGeneric prepares sql as name and explains its execution with args
// (under plan_cache_mode = force_generic_plan, the generic plan), then
// deallocates it.
func explainGeneric(ctx context.Context, conn *pgx.Conn, name, sql string, args []any) ([]byte, error) {
	desc, err := conn.Prepare(ctx, name, sql)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Deallocate(ctx, name) }()
	// pgx takes options (a QueryExecMode, for one) among the arguments.
	var values []any
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
			continue
		}
		values = append(values, a)
	}
	if len(values) != len(desc.ParamOIDs) {
		return nil, fmt.Errorf("%d arguments recorded for %d parameters", len(values), len(desc.ParamOIDs))
	}
	// EXECUTE takes its arguments as expressions, not as the parameters of
	// the statement that runs it: each goes as a literal of its text form,
	// which EXECUTE casts to its parameter's type.
	literals := make([]string, len(values))
	for i, v := range values {
		text, err := conn.TypeMap().Encode(desc.ParamOIDs[i], pgtype.TextFormatCode, v, nil)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		literals[i] = "NULL"
		if text != nil {
			literals[i] = "'" + strings.ReplaceAll(string(text), "'", "''") + "'"
		}
	}
	explain := "EXPLAIN (FORMAT JSON) EXECUTE " + pgx.Identifier{name}.Sanitize()
	if len(literals) > 0 {
		explain += "(" + strings.Join(literals, ", ") + ")"
	}
	var plan []byte
	err = conn.QueryRow(ctx, explain).Scan(&plan)
	return plan, err
}

// touchesAny reports whether sql names one of the partitioned tables.
func touchesAny(sql string, parents map[string]bool) bool {
	lower := strings.ToLower(sql)
	for p := range parents {
		if strings.Contains(lower, p) {
			return true
		}
	}
	return false
}

// explainable reports whether sql is a statement EXPLAIN takes.
func explainable(sql string) bool {
	first := strings.ToUpper(strings.Fields(strings.TrimSpace(stripComments(sql)) + " x")[0])
	return slices.Contains([]string{"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"}, first)
}

func stripComments(sql string) string {
	var out []string
	for _, line := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// name is a statement's sqlc name ("-- name: OrderGet :one"), or else its
// text on one line.
func name(sql string) string {
	if rest, ok := strings.CutPrefix(strings.TrimSpace(sql), "-- name: "); ok {
		return strings.Fields(rest)[0]
	}
	return oneLine(sql)
}

func oneLine(sql string) string {
	s := strings.Join(strings.Fields(stripComments(sql)), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// scans counts, per partitioned table, the partitions a JSON plan still
// scans after pruning: the plan nodes on a relation that is a partition
// (its name is parent_pN).
func scans(plan []byte, parents map[string]bool) map[string]int {
	var doc []map[string]any
	if json.Unmarshal(plan, &doc) != nil || len(doc) == 0 {
		return nil
	}
	counts := map[string]int{}
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		if rel, ok := node["Relation Name"].(string); ok {
			if i := strings.LastIndex(rel, "_p"); i > 0 && parents[rel[:i]] {
				counts[rel[:i]]++
			}
		}
		if children, ok := node["Plans"].([]any); ok {
			for _, c := range children {
				if m, ok := c.(map[string]any); ok {
					walk(m)
				}
			}
		}
	}
	if root, ok := doc[0]["Plan"].(map[string]any); ok {
		walk(root)
	}
	return counts
}

// Matching returns the recorded statements that contain text, sorted.
func (s *Statements) Matching(text string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for sql := range s.seen {
		if strings.Contains(sql, text) {
			out = append(out, sql)
		}
	}
	slices.Sort(out)
	return out
}
