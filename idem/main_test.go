package idem

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/pgtest"
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
