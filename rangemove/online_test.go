package rangemove

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
)

// seedRange applies n transfers from accounts in 40-80 on sa (every tenth owes its credit to an
// account of 80-, the others credit an account of 40-80) and returns them.
func (c *cluster) seedRange(from, n int) []idem.TransferRequest {
	c.t.Helper()
	var reqs []idem.TransferRequest
	for i := from; i < from+n; i++ {
		reqs = append(reqs, benchTransfer(i, true, i%10 == 0))
	}
	for i := 0; i < len(reqs); i += 200 {
		res, err := idem.TransferBatch(context.Background(), c.pool("sa"), reqs[i:min(i+200, len(reqs))])
		if err != nil {
			c.t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != idem.Applied {
				c.t.Fatalf("seed: %v", r.Outcome)
			}
		}
	}
	return reqs
}

// post applies req on whichever of sa and sb owns its range, asking again after a few ms while
// neither does (the fence), and returns the outcome.
func (c *cluster) post(ctx context.Context, req idem.TransferRequest) (idem.Outcome, error) {
	for {
		for _, shard := range []string{"sa", "sb"} {
			res, err := idem.Transfer(ctx, c.pool(shard), req)
			if err != nil {
				return "", err
			}
			if res.Outcome != idem.NotOwner {
				return res.Outcome, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// checkMoved checks that every one of reqs lives on sb exactly once (one record, one debit, its
// credit there or owed from there) and replays there, and that sa holds no row of 40-80.
func (c *cluster) checkMoved(reqs []idem.TransferRequest) {
	c.t.Helper()
	ctx := context.Background()
	for i, req := range reqs {
		var records, debits, credits, owed int
		err := c.pool("sb").QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_record WHERE key = $1),
			(SELECT count(*) FROM ledger_entries WHERE transfer_id = $2 AND kind = 'transfer_out'),
			(SELECT count(*) FROM ledger_entries WHERE transfer_id = $2 AND kind = 'transfer_in'),
			(SELECT count(*) FROM shardgate_credit_outbox WHERE transfer_id = $2)`, req.Key, req.TransferID).Scan(&records, &debits, &credits, &owed)
		if err != nil {
			c.t.Fatal(err)
		}
		if records != 1 || debits != 1 || credits+owed != 1 {
			c.t.Fatalf("%s (%d of %d) on sb: %d records, %d debits, %d credits, %d owed; want 1, 1 and its credit once", req.Key, i, len(reqs), records, debits, credits, owed)
		}
		res, err := idem.Transfer(ctx, c.pool("sb"), req)
		if err != nil || res.Outcome != idem.Replayed {
			c.t.Fatalf("retry of %s on sb: %v %v, want replayed", req.Key, res.Outcome, err)
		}
	}
	var left int
	if err := c.pool("sa").QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_record WHERE keyspace_id >= $1 AND keyspace_id < 0)
		+ (SELECT count(*) FROM ledger_entries WHERE keyspace_id >= $1 AND keyspace_id < 0)
		+ (SELECT count(*) FROM shardgate_credit_outbox WHERE keyspace_id >= $1 AND keyspace_id < 0)`, int64(-1)<<62).Scan(&left); err != nil || left != 0 {
		c.t.Fatalf("sa kept %d rows of 40-80 (%v)", left, err)
	}
}

// Transfers posted into the moving range while it is copied land once each, on the new owner;
// retries of keys completed before the move, during it and after all replay, and a key retried
// throughout the move is never applied again; owed credits move with the state the relay gave
// them during the copy.
func TestOnlineMoveUnderLoad(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	before := c.seedRange(0, 1200)

	var (
		mu       sync.Mutex
		acked    []idem.TransferRequest
		stop     atomic.Bool
		wg       sync.WaitGroup
		next     atomic.Int64
		reapply  atomic.Int64
		failures = make(chan error, 10)
	)
	next.Store(100000)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				req := benchTransfer(int(next.Add(1)), true, next.Load()%7 == 0)
				out, err := c.post(ctx, req)
				if err == nil && out != idem.Applied {
					err = fmt.Errorf("new key %s: %v", req.Key, out)
				}
				if err != nil {
					failures <- err
					return
				}
				mu.Lock()
				acked = append(acked, req)
				mu.Unlock()
				time.Sleep(3 * time.Millisecond)
			}
		}()
	}
	// A key completed before the move, retried throughout it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			out, err := c.post(ctx, before[1])
			if err == nil && out != idem.Replayed {
				reapply.Add(1)
				err = fmt.Errorf("retry of %s during the move: %v", before[1].Key, out)
			}
			if err != nil {
				failures <- err
				return
			}
		}
	}()

	// During the copy, the relay settles one owed credit and leases another.
	var once sync.Once
	testHook = func(point string) {
		if point == "copy" {
			once.Do(func() {
				if err := idem.SettleCredits(ctx, c.pool("sa"), map[string]time.Time{before[0].TransferID: time.Now()}); err != nil {
					failures <- err
				}
				if _, err := c.pool("sa").Exec(ctx, "UPDATE shardgate_credit_outbox SET lease_owner = 'relay-x', lease_until = now() + interval '1 hour' WHERE transfer_id = $1", before[10].TransferID); err != nil {
					failures <- err
				}
			})
		}
	}
	defer func() { testHook = nil }()
	time.Sleep(200 * time.Millisecond)
	moves, err := Apply(ctx, c.mapOf(2, "sa=-40 sb=40-"), c.pool, Options{Interval: partition.Daily})
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != 1 || moves[0].Records < 1200 {
		t.Fatalf("moves %+v, want one of at least 1200 records", moves)
	}
	if len(acked) < 10 {
		t.Fatalf("only %d transfers acknowledged during the move", len(acked))
	}
	c.checkMoved(append(before, acked...))
	var settled, lease *string
	if err := c.pool("sb").QueryRow(ctx, `SELECT (SELECT settled_at::text FROM shardgate_credit_outbox WHERE transfer_id = $1),
		(SELECT lease_owner FROM shardgate_credit_outbox WHERE transfer_id = $2)`, before[0].TransferID, before[10].TransferID).Scan(&settled, &lease); err != nil {
		t.Fatal(err)
	}
	if settled == nil || lease == nil || *lease != "relay-x" {
		t.Errorf("on sb: %s settled at %v, %s leased by %v; want settled and leased by relay-x as on sa during the copy",
			before[0].TransferID, settled, before[10].TransferID, lease)
	}
	t.Logf("%d transfers acknowledged during the move", len(acked))
}

// An apply stopped (its context cancelled) during the bulk copy, during the catch-up or behind
// the fence completes when run again, from where it stopped, and no key is applied twice.
func TestApplyStoppedResumes(t *testing.T) {
	for _, tc := range []struct {
		point string
		nth   int
	}{{"copy", 2}, {"catch-up", 1}, {"fenced", 1}} {
		t.Run(tc.point, func(t *testing.T) {
			ctx := context.Background()
			c := newCluster(t, "sa", "sb")
			c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
			reqs := c.seedRange(0, 1200)
			v2 := c.mapOf(2, "sa=-40 sb=40-")

			stopCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			calls := 0
			testHook = func(point string) {
				if point == tc.point {
					if calls++; calls == tc.nth {
						cancel()
					}
				}
			}
			defer func() { testHook = nil }()
			first, err := Apply(stopCtx, v2, c.pool, Options{Interval: partition.Daily})
			testHook = nil
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("stopped apply: %v, want context.Canceled", err)
			}
			var stage string
			var copied, total int64
			if err := c.pool("sa").QueryRow(ctx, "SELECT stage, rows_copied, rows_total FROM shardgate_range_move").Scan(&stage, &copied, &total); err != nil {
				t.Fatal(err)
			}
			if tc.point == "copy" && (stage != "records" || copied == 0 || copied >= total) {
				t.Fatalf("stopped in the copy at stage %s, %d of %d rows copied; want part of the records", stage, copied, total)
			}
			// Status and the metrics say where the stopped move stands.
			sts := Status(ctx, v2, c.pool)
			var out strings.Builder
			if failed := PrintStatus(&out, sts, time.Now()); failed != 0 {
				t.Fatalf("status: %d shards unreadable\n%s", failed, out.String())
			}
			phase := map[string]string{"copy": PhaseCopying, "catch-up": PhaseCatchingUp, "fenced": PhaseFenced}[tc.point]
			if want := fmt.Sprintf("moving 40-80 to sb (map version 2): %s, %d of %d rows copied", phase, copied, total); !strings.Contains(out.String(), want) {
				t.Errorf("status lacks %q:\n%s", want, out.String())
			}
			col := &StatusCollector{}
			col.Record(sts)
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(col)
			mfs, err := reg.Gather()
			n := 0
			for _, mf := range mfs {
				if mf.GetName() == "shardgate_range_move_phase" {
					n = len(mf.GetMetric())
				}
			}
			if err != nil || n != 1 {
				t.Errorf("shardgate_range_move_phase: %d series (%v), want 1", n, err)
			}
			// Written after the stop: sa still owns 40-80 unless the fence was up.
			more := []idem.TransferRequest{}
			if tc.point != "fenced" {
				more = c.seedRange(5000, 30)
			}
			moves, err := Apply(ctx, v2, c.pool, Options{Interval: partition.Daily})
			if err != nil {
				t.Fatal(err)
			}
			if tc.point == "copy" && moves[0].Records+first[0].Records > 1200+30 {
				t.Errorf("the resumed copy copied %d records after %d: it started over", moves[0].Records, first[0].Records)
			}
			c.checkMoved(append(reqs, more...))
			var records int
			if err := c.pool("sb").QueryRow(ctx, "SELECT count(*) FROM idempotency_record").Scan(&records); err != nil || records != len(reqs)+len(more) {
				t.Errorf("sb holds %d records, want %d (%v)", records, len(reqs)+len(more), err)
			}
			var moving, changes int
			if err := c.pool("sa").QueryRow(ctx, "SELECT (SELECT count(*) FROM shardgate_range_move), (SELECT count(*) FROM shardgate_range_change)").Scan(&moving, &changes); err != nil || moving+changes != 0 {
				t.Errorf("sa still lists %d moves and %d changes (%v)", moving, changes, err)
			}
		})
	}
}
