package idem

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/shardmap"
)

// testPG is the PostgreSQL server of this test binary, started fresh by TestMain; nil when the
// server binaries are missing outside CI, and then testPGErr says why.
var (
	testPG    *localpg.Server
	testPGErr error
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := localpg.Start(ctx, localpg.Options{})
	cancel()
	if err != nil {
		// A test that cannot reach a server tests nothing: in CI that is a failure, not a skip.
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "CI is set and PostgreSQL could not start: %v\n", err)
			return 1
		}
		testPGErr = err
		return m.Run()
	}
	defer s.Close()
	testPG = s
	return m.Run()
}

var scratchSeq atomic.Int64

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

// migratedDB creates a fresh migrated database, owning nothing, with suffix in its name (tests
// with several shards tell them apart by it), and returns a pool on it.
func migratedDB(t *testing.T, suffix string) *pgxpool.Pool {
	t.Helper()
	if testPG == nil {
		t.Skipf("PostgreSQL server binaries not found: %v", testPGErr)
	}
	ctx := context.Background()
	name := fmt.Sprintf("t%d_%s%s", scratchSeq.Add(1), suffix, strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")))
	name = name[:min(len(name), 63)]
	admin, err := pgx.Connect(ctx, testPG.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testPG.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	u.RawQuery += "&pool_max_conns=20" // room for the concurrent tests' goroutines
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}
