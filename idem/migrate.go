package idem

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change, from migrations/NNNN_name.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Advisory lock ids, in (classid, objid) form so they never meet the single-bigint keys that
// the transfer functions take per idempotency key. LockClass 21319 is "SG". The migrations name
// LockClass and LockOwnership too; TestSQLConstantsMatchMigrations holds the two sides together.
const (
	LockClass     = 21319
	LockMigrate   = 0
	LockOwnership = 1 // taken shared by every transfer, exclusively by ownership changes
	LockUpkeep    = 2
	LockApply     = 3 // held by a shard map apply on every shard for its whole run
	LockWatch     = 4 // held on the map's first shard by the router that runs the periodic reconcile
)

// Seeds of hashtextextended for the per-key try-locks of the transfer functions (and of the copy of
// moved records): the key lock over scope and key, and the request lock over scope, key and
// request hash. They are SQL's; named here so that a test can check them.
const (
	KeyLockSeed     = 1
	RequestLockSeed = 2
)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, path := range entries {
		base := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %s: name must be NNNN_name.sql", path)
		}
		body, err := migrationFiles.ReadFile(path)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("two migrations have version %d", ms[i].Version)
		}
	}
	return ms, nil
}

// Migrate applies every migration the shard behind pool has not applied yet, each in its own
// transaction, and returns the names of those it applied. Routers migrating the same shard at
// once are serialized by a session advisory lock, so each migration runs exactly once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", LockClass, LockMigrate); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	// Unlock on a fresh context: the caller's may be what ended us.
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", LockClass, LockMigrate) //nolint:errcheck // the session ends with the connection anyway

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS shardgate_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create shardgate_schema_migrations: %w", err)
	}
	done := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM shardgate_schema_migrations")
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	for _, v := range versions {
		done[int(v)] = true
	}

	var applied []string
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// Exec without arguments uses the simple protocol, which allows many statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO shardgate_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
		}
		applied = append(applied, fmt.Sprintf("%04d_%s", m.Version, m.Name))
	}
	return applied, nil
}
