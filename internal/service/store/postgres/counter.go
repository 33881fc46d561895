package postgres

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx tracer that counts what a pool sends to PostgreSQL, for
// the tests that pin a request's round trips and for make bench's cost per
// request. Install it with WithQueryTracer.
type Counter struct {
	// RoundTrips counts statements sent on their own and pipelines, each
	// pipeline once however many statements it holds.
	RoundTrips atomic.Int64
	// Statements counts every statement, in a pipeline or not.
	Statements atomic.Int64
}

// TraceQueryStart counts a statement sent on its own.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.RoundTrips.Add(1)
	c.Statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a pipeline.
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.RoundTrips.Add(1)
	return ctx
}

// TraceBatchQuery counts a statement of a pipeline.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.Statements.Add(1)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
