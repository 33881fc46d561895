package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the key table's schema, one numbered file per version
// (NNNN_name.sql), each applied once and never edited once released.
//
//go:embed migrations/*.sql
var migrations embed.FS

// functions are the SQL functions pgstore gives the application's SQL
// (the guard, Store.Guard), one file each. They are code, not data:
// Migrate creates or replaces them on every run, after the versions,
// without a version of their own, so that adding one leaves the key
// table's version where a previous release, which refuses a version newer
// than it knows, still runs on it (docs/operations.md, "Upgrades and
// rollbacks"). Each is CREATE OR REPLACE, and none is ever dropped.
//
//go:embed functions/*.sql
var functions embed.FS

// migration is one version of the key table's schema.
type migration struct {
	version int
	name    string
	sql     string
}

// Migrate creates or upgrades the key table named by opts, and records the
// versions applied in a table of its own (the key table's name and
// "_schema_version"). A session advisory lock serialises concurrent callers,
// so replicas that start together migrate once, and the others wait, then
// find nothing to do. Each version is applied in a transaction of its own.
//
// A table that a newer pgstore migrated further is left as it is: its
// migrations are additive, so this pgstore runs on it (a rollback).
//
// A database that an earlier pgstore migrated with goose (a table named like
// the key table and "_migrations") is adopted: its applied versions are
// recorded here, and the goose table is dropped.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts Options) error {
	table, err := opts.table()
	if err != nil {
		return err
	}
	scope, err := opts.scope()
	if err != nil {
		return err
	}
	all, err := loadMigrations(table, scope)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer conn.Release()
	// A session lock, held across the versions' transactions; it waits as
	// long as ctx lets it.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID(table)); err != nil {
		return fmt.Errorf("pgstore: migrate: take the migration lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID(table))
	}()

	versions := pgx.Identifier{table + "_schema_version"}.Sanitize()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+versions+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("pgstore: migrate: create %s: %w", versions, err)
	}
	if err := adoptGoose(ctx, conn.Conn(), table, versions, all); err != nil {
		return err
	}
	var applied int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+versions).Scan(&applied); err != nil {
		return fmt.Errorf("pgstore: migrate: read %s: %w", versions, err)
	}
	// A table at a version newer than this pgstore knows was migrated by a
	// newer release, and this one is its rollback: every migration is
	// additive (new columns nullable or defaulted, none dropped, renamed or
	// retyped while a release that reads it may still run), so this release
	// runs on the newer table as it is, and applies nothing.
	for _, m := range all[min(applied, len(all)):] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+versions+` (version, name) VALUES ($1, $2)`, m.version, m.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("pgstore: migrate: apply %s: %w", m.name, err)
		}
	}
	if err := createFunctions(ctx, conn.Conn(), table); err != nil {
		return err
	}
	return checkScopeType(ctx, conn, table, scope)
}

// createFunctions creates or replaces the functions pgstore gives the
// application's SQL, named after table.
func createFunctions(ctx context.Context, conn *pgx.Conn, table string) error {
	names, err := fs.Glob(functions, "functions/*.sql")
	if err != nil {
		return fmt.Errorf("pgstore: read functions: %w", err)
	}
	for _, name := range names {
		b, err := fs.ReadFile(functions, name)
		if err != nil {
			return fmt.Errorf("pgstore: read functions: %w", err)
		}
		if _, err := conn.Exec(ctx, strings.ReplaceAll(string(b), DefaultTable, table)); err != nil {
			return fmt.Errorf("pgstore: migrate: create %s: %w", path.Base(name), err)
		}
	}
	return nil
}

// adoptGoose records the versions that an earlier pgstore applied with
// goose, then drops goose's table, so that the engine has one version
// table.
func adoptGoose(ctx context.Context, conn *pgx.Conn, table, versions string, all []migration) error {
	goose := table + "_migrations"
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{goose}.Sanitize()).Scan(&exists); err != nil {
		return fmt.Errorf("pgstore: migrate: look for %s: %w", goose, err)
	}
	if !exists {
		return nil
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var done int
		err := tx.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+pgx.Identifier{goose}.Sanitize()+` WHERE is_applied`).Scan(&done)
		if err != nil {
			return fmt.Errorf("pgstore: migrate: read %s: %w", goose, err)
		}
		if done > len(all) {
			return fmt.Errorf("pgstore: migrate: %s is at version %d, newer than this pgstore knows (%d)", goose, done, len(all))
		}
		for _, m := range all[:done] {
			if _, err := tx.Exec(ctx, `INSERT INTO `+versions+` (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`, m.version, m.name); err != nil {
				return fmt.Errorf("pgstore: migrate: adopt %s: %w", goose, err)
			}
		}
		if _, err := tx.Exec(ctx, `DROP TABLE `+pgx.Identifier{goose}.Sanitize()); err != nil {
			return fmt.Errorf("pgstore: migrate: drop %s: %w", goose, err)
		}
		return nil
	})
}

// migrationCount is how many migrations there are: the version of a key
// table that this pgstore migrated.
var migrationCount = func() int {
	all, err := loadMigrations(DefaultTable, ScopeBytea)
	if err != nil {
		panic(err) // the embedded files, tested by every test that migrates
	}
	return len(all)
}()

// loadMigrations reads the embedded migrations in version order, with the
// default table name (and the index names it prefixes) replaced by table,
// and the scope columns declared as the key table's (scopeColumn) of type
// scope. Versions are 1, 2, 3… without a gap, so that the number applied
// says which.
func loadMigrations(table string, scope ScopeType) ([]migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("pgstore: read migrations: %w", err)
	}
	out := make([]migration, 0, len(names))
	for _, name := range names { // Glob sorts them
		base := path.Base(name)
		number, _, _ := strings.Cut(base, "_")
		version, err := strconv.Atoi(number)
		if err != nil || version != len(out)+1 {
			return nil, errors.New("pgstore: migration " + base + " is out of sequence")
		}
		b, err := fs.ReadFile(migrations, name)
		if err != nil {
			return nil, fmt.Errorf("pgstore: read migrations: %w", err)
		}
		sql := string(b)
		if version == 1 && !strings.Contains(sql, scopeColumn) {
			return nil, errors.New("pgstore: migration " + base + " does not declare the scope column as pgstore expects")
		}
		// The key table's scope column, and that of every table keyed as
		// it is (the pieces of bodies, 0005), are declared of type scope.
		sql = strings.ReplaceAll(sql, scopeColumn, scope.column())
		out = append(out, migration{version: version, name: strings.TrimSuffix(base, ".sql"), sql: strings.ReplaceAll(sql, DefaultTable, table)})
	}
	return out, nil
}
