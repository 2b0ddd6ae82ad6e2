package rangemove

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/partition"
)

// killableCluster is a cluster of shards sa and sb where shard killable runs on a PostgreSQL
// server of its own, which the test can kill and restart; the other shard is a database of the
// test server. It returns the cluster, the killable shard's server and its password.
func killableCluster(t *testing.T, killable string) (*cluster, *localpg.Server, string) {
	t.Helper()
	other := map[string]string{"sa": "sb", "sb": "sa"}[killable]
	pools := shardtest.New(t, other) // skips without server binaries
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	password := "pw-" + rand.Text()
	srv, err := localpg.Start(ctx, localpg.Options{Password: password})
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("PostgreSQL not available: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	cfg, err := pgxpool.ParseConfig(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := idem.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate shard %s: %v", killable, err)
	}
	if _, err := idem.EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 1); err != nil {
		t.Fatalf("partitions of shard %s: %v", killable, err)
	}
	pools[killable] = pool
	return &cluster{t: t, pools: pools}, srv, password
}

// A shard killed while a move's catch-up runs (the source, which serves the range, or the
// destination, which receives it) stops the apply with an error that says what failed, and
// leaves the range on the source; once the shard is back, running apply again completes the
// move. Every key is applied exactly once and ends on the new owner only; keys completed
// before the move, during its copy and between the two runs replay and never apply again.
func TestMoveShardKilledDuringCatchUp(t *testing.T) {
	for _, killed := range []string{"sa", "sb"} {
		t.Run(map[string]string{"sa": "source", "sb": "destination"}[killed], func(t *testing.T) {
			ctx := context.Background()
			c, srv, password := killableCluster(t, killed)
			c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
			before := c.seedRange(0, 600)
			v2 := c.mapOf(2, "sa=-40 sb=40-")

			// During the copy: transfers into the range, and a transaction on sa that holds
			// back its oldest running transaction, so that the catch-up leaves those changes
			// behind. At the first catch-up pass that transaction ends and the shard is
			// killed: the next pass has changes to read on sa and to write on sb.
			var (
				during  []idem.TransferRequest
				holding *pgxpool.Conn
				hookErr error
				kills   int
			)
			release := func() {
				if holding != nil {
					_, _ = holding.Exec(ctx, "ROLLBACK")
					holding.Release()
					holding = nil
				}
			}
			testHook = func(point string) {
				switch {
				case point == "copy" && during == nil:
					conn, err := c.pool("sa").Acquire(ctx)
					if err != nil {
						hookErr = err
						return
					}
					holding = conn
					if _, err := conn.Exec(ctx, "BEGIN; SELECT txid_current()"); err != nil {
						hookErr = err
						return
					}
					during = c.seedRange(1000, 40)
				case point == "catch-up" && kills == 0:
					kills++
					release()
					if err := srv.Kill(); err != nil {
						hookErr = err
					}
				}
			}
			defer func() { testHook = nil }()
			_, err := Apply(ctx, v2, c.pool, Options{Interval: partition.Daily, CatchUpBelow: 10})
			testHook = nil
			release()
			if hookErr != nil {
				t.Fatal(hookErr)
			}
			if kills != 1 || len(during) != 40 {
				t.Fatalf("the hook killed %d times after seeding %d transfers during the copy; want 1 and 40", kills, len(during))
			}
			if want := "copy 40-80 from sa to sb: catch up: shard " + killed + ": "; err == nil || errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), want) {
				t.Fatalf("apply with %s killed during the catch-up: %v; want an error of the catch-up naming %s (%q)", killed, err, killed, want)
			}
			if strings.Contains(err.Error(), password) {
				t.Fatalf("the error shows the shard's password: %v", err)
			}
			t.Logf("apply with %s killed: %v", killed, err)

			restartCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := srv.Restart(restartCtx); err != nil {
				t.Fatal(err)
			}
			// Apply runs again as a new process would: on new connections.
			c.pool(killed).Reset()
			// The range is still sa's: retries replay there, new keys apply there once.
			if got := c.owned("sa"); got != "[-80] | []" {
				t.Errorf("sa owns %s after the failed apply, want [-80] still", got)
			}
			for _, req := range []idem.TransferRequest{before[0], before[599], during[0], during[39]} {
				if out, err := c.post(ctx, req); err != nil || out != idem.Replayed {
					t.Fatalf("retry of %s between the runs: %v %v, want replayed", req.Key, out, err)
				}
			}
			after := c.seedRange(2000, 20)

			moves, err := Apply(ctx, v2, c.pool, Options{Interval: partition.Daily})
			if err != nil {
				t.Fatalf("apply again with %s back: %v", killed, err)
			}
			if len(moves) != 1 {
				t.Fatalf("moves %+v, want one", moves)
			}
			all := append(append(append([]idem.TransferRequest{}, before...), during...), after...)
			c.checkMoved(all) // once each on sb, replayed there, nothing of 40-80 left on sa
			var records int
			if err := c.pool("sb").QueryRow(ctx, "SELECT count(*) FROM idempotency_record").Scan(&records); err != nil || records != len(all) {
				t.Errorf("sb holds %d records, want %d (%v)", records, len(all), err)
			}
			for _, req := range []idem.TransferRequest{before[1], during[1], after[1]} {
				if out, err := c.post(ctx, req); err != nil || out != idem.Replayed {
					t.Errorf("retry of %s after the move: %v %v, want replayed", req.Key, out, err)
				}
			}
			var moving, changes int
			if err := c.pool("sa").QueryRow(ctx, "SELECT (SELECT count(*) FROM shardgate_range_move), (SELECT count(*) FROM shardgate_range_change)").Scan(&moving, &changes); err != nil || moving+changes != 0 {
				t.Errorf("sa still lists %d moves and %d changes (%v)", moving, changes, err)
			}
		})
	}
}
