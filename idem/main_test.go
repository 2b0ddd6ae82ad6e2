package idem

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// releaseDB creates a fresh database as the release with migrations 0001-n left it (n is one of
// releaseFixtures: testdata/release_NNNN.sql, its functions included), owning the whole
// keyspace, with the partitions for today and two days ahead, and returns a pool on it with this
// release's migrations: those after n, and the function files, are the upgrade under test.
func releaseDB(t *testing.T, n int) (*pgxpool.Pool, []Migration) {
	t.Helper()
	pool := pgtest.NewDB(t, "")
	restoreRelease(t, pool, n)
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
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

// restoreRelease runs testdata/release_NNNN.sql on the empty database behind pool, on a
// connection of its own: the dump empties that session's search_path.
func restoreRelease(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	dump, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("release_%04d.sql", n)))
	if err != nil {
		t.Fatalf("no fixture of the release with migrations 0001-%04d: %v", n, err)
	}
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, string(dump)); err != nil {
		t.Fatalf("restore release_%04d.sql: %v", n, err)
	}
}
