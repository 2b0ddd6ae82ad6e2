package idem

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// scratchDB creates a fresh database on the test server, migrated and owning the whole keyspace,
// and returns a pool on it. Without a server (binaries missing, CI unset) the test is skipped.
func scratchDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := migratedDB(t, "")
	all, err := shardmap.ParseKeyRange("-")
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyOwnership(context.Background(), pool, Ownership{Shard: "scratch", MapVersion: 1, Ranges: []shardmap.KeyRange{all}}, Grant); err != nil {
		t.Fatal(err)
	}
	return pool
}

// migratedDB creates a fresh migrated database, owning nothing, with suffix in its name, and
// returns a pool on it.
func migratedDB(t testing.TB, suffix string) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewDB(t, suffix)
	if _, err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// releaseDB creates a fresh database migrated by the first n migrations only (a shard of an
// earlier release, as migrate leaves it), owning the whole keyspace, with the partitions for
// today and two days ahead, and returns a pool on it with the migrations: those after n are the
// upgrade under test.
func releaseDB(t *testing.T, n int) (*pgxpool.Pool, []Migration) {
	t.Helper()
	pool := pgtest.NewDB(t, "")
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE shardgate_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	for _, m := range ms[:n] {
		mustExec(t, pool, m.SQL)
		mustExec(t, pool, "INSERT INTO shardgate_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
	}
	all, _ := shardmap.ParseKeyRange("-")
	if err := ApplyOwnership(context.Background(), pool, Ownership{Shard: "s", MapVersion: 1, Ranges: []shardmap.KeyRange{all}}, Grant); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsurePartitions(context.Background(), pool, partition.Daily, time.Now(), 2); err != nil {
		t.Fatal(err)
	}
	return pool, ms
}
