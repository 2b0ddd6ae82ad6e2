// Package pgtest gives a test binary one real PostgreSQL server, started fresh as a local
// process, and a new database on it per test: the storage tests of idem and rangemove run
// against PostgreSQL itself, never a mock. Without server binaries the tests skip, except when
// CI is set, where that is a failure: a skipped test tests nothing. Package shardtest builds
// the shards of a multi-shard test on the same server.
package pgtest

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
)

var (
	server    *localpg.Server
	serverErr error
	seq       atomic.Int64
)

// Main starts the server, runs the tests and stops it; call it from TestMain:
// os.Exit(pgtest.Main(m)). SHARDGATE_PG_SETTINGS, if set, is server settings as space-separated
// name=value pairs over localpg's defaults: a benchmark whose data outgrows the small test
// server (shared_buffers=32MB) sizes it as a shard would be.
func Main(m *testing.M) int {
	settings, err := Settings()
	if err != nil {
		fmt.Fprintf(os.Stderr, "SHARDGATE_PG_SETTINGS: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := localpg.Start(ctx, localpg.Options{Settings: settings})
	cancel()
	if err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "CI is set and PostgreSQL could not start: %v\n", err)
			return 1
		}
		serverErr = err
		return m.Run()
	}
	defer s.Close()
	server = s
	return m.Run()
}

// Settings are the server settings SHARDGATE_PG_SETTINGS gives, for a test that starts
// servers of its own.
func Settings() (map[string]string, error) {
	return parseSettings(os.Getenv("SHARDGATE_PG_SETTINGS"))
}

// parseSettings reads space-separated name=value pairs.
func parseSettings(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		name, value, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q is not name=value", f)
		}
		out[name] = value
	}
	return out, nil
}

// NewDB creates an empty database named after the test (and suffix, which tells several
// shards of one test apart) and returns a pool on it with room for the test's goroutines,
// closed with the test. Without a server the test is skipped.
func NewDB(t testing.TB, suffix string) *pgxpool.Pool {
	t.Helper()
	if server == nil {
		t.Skipf("PostgreSQL server binaries not found: %v", serverErr)
	}
	ctx := context.Background()
	name := fmt.Sprintf("t%d_%s%s", seq.Add(1), suffix, strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")))
	name = name[:min(len(name), 63)]
	admin, err := pgx.Connect(ctx, server.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(server.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	u.RawQuery += "&pool_max_conns=20"
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
