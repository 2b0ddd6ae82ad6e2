package idem

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/pgtest"
)

// Shards built by earlier releases, for the upgrade tests: testdata/release_NNNN.sql is a
// plain-text pg_dump of a database that ran migrations 0001-NNNN as the release that had them
// left it (those migrations still defined the SQL functions then), bookkeeping rows included.
// They are fixtures of past releases, not definitions: the functions of this release live in
// sql/. scripts/release-fixtures.sh writes them again (TestWriteReleaseFixtures).
var releaseFixtures = []int{3, 5, 7}

// fixtureRevEnv names the git revision TestWriteReleaseFixtures reads the past migrations from;
// unset, the test is skipped.
const fixtureRevEnv = "SHARDGATE_WRITE_RELEASE_FIXTURES"

// TestWriteReleaseFixtures writes testdata/release_NNNN.sql from the migrations of a past
// revision (the last with function bodies in migrations: 7256034): for each, a fresh database
// migrated as that release's Migrate did (shardgate_schema_migrations, one transaction per
// migration), dumped by pg_dump.
func TestWriteReleaseFixtures(t *testing.T) {
	rev := os.Getenv(fixtureRevEnv)
	if rev == "" {
		t.Skipf("set %s to a git revision to write the release fixtures", fixtureRevEnv)
	}
	ctx := context.Background()
	for _, n := range releaseFixtures {
		pool := pgtest.NewDB(t, fmt.Sprintf("r%d", n))
		mustExec(t, pool, `CREATE TABLE IF NOT EXISTS shardgate_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`)
		for v := 1; v <= n; v++ {
			path, body := pastMigration(t, rev, v)
			name := strings.TrimSuffix(strings.SplitN(filepath.Base(path), "_", 2)[1], ".sql")
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, body); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO shardgate_schema_migrations (version, name) VALUES ($1, $2)", v, name)
				return err
			})
			if err != nil {
				t.Fatalf("%s at %s: %v", path, rev, err)
			}
		}
		// What the migrations dated now(), at a fixed past time: the fixture does not change when
		// written again, and reads as a shard migrated long ago.
		mustExec(t, pool, "UPDATE shardgate_schema_migrations SET applied_at = '2026-01-01T00:00:00Z'")
		if n >= 4 {
			mustExec(t, pool, "UPDATE shardgate_credit_sweep SET since = '2026-01-01T00:00:00Z'")
		}
		if n >= 6 {
			mustExec(t, pool, "UPDATE shardgate_record_floor SET unchecked_before = '2026-01-01T01:00:00Z'")
		}
		dump := pgDump(t, pool)
		head := fmt.Sprintf("-- A shard as the release with migrations 0001-%04d left it: pg_dump of a database that ran\n"+
			"-- idem/migrations 0001-%04d of revision %s. A fixture of a past release for the upgrade tests, not a\n"+
			"-- definition. Written by scripts/release-fixtures.sh; do not edit.\n", n, n, rev)
		if err := os.WriteFile(filepath.Join("testdata", fmt.Sprintf("release_%04d.sql", n)), []byte(head+dump), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// pastMigration returns the path and text of migration v at git revision rev.
func pastMigration(t *testing.T, rev string, v int) (string, string) {
	t.Helper()
	out, err := exec.Command("git", "ls-tree", "--name-only", rev, "migrations/").Output()
	if err != nil {
		t.Fatalf("git ls-tree %s: %v", rev, err)
	}
	prefix := fmt.Sprintf("migrations/%04d_", v)
	for _, path := range strings.Fields(string(out)) {
		if strings.HasPrefix(path, prefix) {
			body, err := exec.Command("git", "show", rev+":./"+path).Output()
			if err != nil {
				t.Fatalf("git show %s:%s: %v", rev, path, err)
			}
			return path, string(body)
		}
	}
	t.Fatalf("revision %s has no migration %04d", rev, v)
	return "", ""
}

// pgDump dumps the database behind pool as plain SQL that restoreRelease can run on a
// connection of its own (the dump sets an empty search_path): rows as INSERTs, no owners or
// grants, no psql meta-commands.
func pgDump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	bin, err := localpg.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("pool_max_conns") // pgxpool's, unknown to libpq
	u.RawQuery = q.Encode()
	cmd := exec.Command(filepath.Join(bin, "pg_dump"), "--no-owner", "--no-privileges", "--inserts", "--no-comments", "--dbname", u.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pg_dump: %v: %s", err, stderr.String())
	}
	drop := regexp.MustCompile(`^(\\(un)?restrict |-- Dumped (from|by) )`)
	var kept []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if !drop.MatchString(sc.Text()) {
			kept = append(kept, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(kept, "\n") + "\n"
}
