// Command testenv prepares and checks the machine for make test.
//
//	testenv check -connections N
//
// runs before the suite: it checks that PostgreSQL has N connections free,
// the most the suite holds at once, and that Redis answers; otherwise it
// prints one line for each that does not and exits 1. Without it a busy
// server fails the suite halfway, with "too many clients already" and 503s
// in packages far from the cause.
//
//	testenv crowd -leave N -ready FILE
//
// is make test/busy's other program: it holds every connection PostgreSQL
// has free but N, creates FILE once it holds them, and keeps them until it
// is stopped.
//
// Both read the servers the tests read: DATABASE_URL (TEST_DATABASE_URL
// first, where set) and REDIS_URL, on loopback by default.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testenv check -connections N | testenv crowd -leave N -ready FILE")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("testenv "+os.Args[1], flag.ExitOnError)
	n := flags.Int("connections", 0, "check: PostgreSQL connections the suite holds at most")
	leave := flags.Int("leave", 0, "crowd: PostgreSQL connections to leave free")
	ready := flags.String("ready", "", "crowd: a file to create once the connections are held")
	_ = flags.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "check":
		err = check(*n)
	case "crowd":
		err = crowd(*leave, *ready)
	default:
		err = fmt.Errorf("no command %q: check or crowd", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// check fails, with a line for each server that cannot serve the suite,
// unless PostgreSQL has need connections free and Redis answers.
func check(need int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var failed []error
	if free, s, err := freeConnections(ctx); err != nil {
		failed = append(failed, err)
	} else if free < need {
		failed = append(failed, fmt.Errorf("make test needs %d PostgreSQL connections at %s, which has %d free (%s): close %d other sessions, or raise max_connections",
			need, s.where, free, s, need-free))
	}
	if err := redisAnswers(ctx, redistest.SharedURL()); err != nil {
		failed = append(failed, err)
	}
	return errors.Join(failed...)
}

// serverState is what PostgreSQL's connection limit leaves an ordinary
// session.
type serverState struct {
	where                  string // host:port
	limit, inUse, reserved int
}

func (s serverState) String() string {
	return fmt.Sprintf("max_connections %d, %d in use, %d reserved", s.limit, s.inUse, s.reserved)
}

// freeConnections is how many more sessions an ordinary role may open on
// the tests' PostgreSQL: max_connections less the sessions open (this one
// apart) and the slots kept for superusers and, from PostgreSQL 16, for
// pg_use_reserved_connections.
func freeConnections(ctx context.Context) (int, serverState, error) {
	adminURL := pgstoretest.AdminURL()
	var s serverState
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return 0, s, fmt.Errorf("DATABASE_URL: %w", err)
	}
	s.where = fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, s, fmt.Errorf("make test needs PostgreSQL at %s (DATABASE_URL): %w", s.where, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int,
		current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0)`).
		Scan(&s.limit, &s.inUse, &s.reserved)
	if err != nil {
		return 0, s, fmt.Errorf("read PostgreSQL's connection limit at %s: %w", s.where, err)
	}
	return max(s.limit-s.inUse-s.reserved, 0), s, nil
}

// redisAnswers fails unless the Redis at redisURL answers PING.
func redisAnswers(ctx context.Context, redisURL string) error {
	rdb, err := redisstore.NewClient(redisURL)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("make test needs Redis at %s (REDIS_URL): %w", rdbAddr(redisURL), err)
	}
	return nil
}

// rdbAddr is the host and port of a Redis URL, for messages: never its
// password.
func rdbAddr(redisURL string) string {
	if u, err := url.Parse(redisURL); err == nil && u.Host != "" {
		return u.Host
	}
	return "REDIS_URL's server"
}

// crowd holds every free PostgreSQL connection but leave, as another
// program on a shared server would, until SIGINT or SIGTERM.
func crowd(leave int, ready string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	free, s, err := freeConnections(ctx)
	if err != nil {
		return err
	}
	hold := free - leave
	if hold < 0 {
		return fmt.Errorf("testenv crowd: PostgreSQL at %s has %d connections free (%s), fewer than the %d to leave", s.where, free, s, leave)
	}
	cfg, err := pgx.ParseConfig(pgstoretest.AdminURL())
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "testenv crowd"
	for i := range hold {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("testenv crowd: connection %d of %d: %w", i+1, hold, err)
		}
		defer conn.Close(context.Background())
	}
	fmt.Printf("testenv crowd: holding %d of PostgreSQL's connections at %s, leaving %d free\n", hold, s.where, leave)
	if ready != "" {
		if err := os.WriteFile(ready, nil, 0o644); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}
