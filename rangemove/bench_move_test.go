package rangemove

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
)

// TestBenchMove is the range-move benchmark (scripts/bench-move.sh, `make bench-move`), run only
// when SHARDGATE_BENCH_MOVE is set to the number of transfers S to seed: S transfers into the
// range 40-80 of shard sa (nine in ten credit an account of the same range, one in ten an
// account of sb, whose credit is owed), written by the transfer functions as the router writes
// them. Then SHARDGATE_BENCH_MOVE_CLIENTS clients (8 unless set), each posting
// SHARDGATE_BENCH_MOVE_RATE transfers a second at most (50 unless set), post new transfers, half into
// 40-80 and half into -40, each to the shard that owns its account (a client that finds no owner
// — the fence — asks again after 5 ms with the same key), while 40-80 moves to sb. It prints the
// apply time and rate, and for the moving range and the other range the longest time without
// an applied transfer, the refusals, and p99 latency before and during the move; then it checks
// every row: each acknowledged key has one record, one debit and its credit (or owed credit),
// all on the shard that owns it, and no row is left on the old owner.
func TestBenchMove(t *testing.T) {
	size, _ := strconv.Atoi(os.Getenv("SHARDGATE_BENCH_MOVE"))
	if size <= 0 {
		t.Skip("set SHARDGATE_BENCH_MOVE to the number of transfers to seed")
	}
	clients, rate := 8, 50
	if n, err := strconv.Atoi(os.Getenv("SHARDGATE_BENCH_MOVE_CLIENTS")); err == nil {
		clients = n
	}
	if n, err := strconv.Atoi(os.Getenv("SHARDGATE_BENCH_MOVE_RATE")); err == nil && n > 0 {
		rate = n
	}
	pace := time.Second / time.Duration(rate)
	ctx := context.Background()
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))

	start := time.Now()
	var seeded atomic.Int64
	var wg sync.WaitGroup
	const group = 200
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * group; i < size; i += 2 * group {
				var reqs []idem.TransferRequest
				for j := i; j < min(i+group, size); j++ {
					reqs = append(reqs, benchTransfer(j, true, j%10 == 0))
				}
				res, err := idem.TransferBatch(ctx, c.pool("sa"), reqs)
				if err != nil {
					t.Error(err)
					return
				}
				for _, r := range res {
					if r.Outcome != idem.Applied {
						t.Errorf("seed: %v", r.Outcome)
						return
					}
				}
				seeded.Add(int64(len(reqs)))
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("seeded %d transfers into 40-80 in %v", seeded.Load(), time.Since(start).Round(time.Millisecond))

	// Load: each client posts transfers one after another, to the owner of its range.
	type sample struct {
		at      time.Time
		latency time.Duration
	}
	var (
		mu        sync.Mutex
		samples   = map[bool][]sample{} // by moving range
		refusals  = map[bool]int{}
		acked     = map[string]idem.TransferRequest{}
		stop      atomic.Bool
		loadWG    sync.WaitGroup
		nextIndex atomic.Int64
	)
	nextIndex.Store(int64(size))
	owner := func(moving bool) []*pgxpool.Pool {
		if moving {
			return []*pgxpool.Pool{c.pool("sa"), c.pool("sb")}
		}
		return []*pgxpool.Pool{c.pool("sa")}
	}
	for w := range clients {
		moving := w%2 == 0
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			next := time.Now()
			for !stop.Load() {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(pace)
				req := benchTransfer(int(nextIndex.Add(1)), moving, false)
				begin := time.Now()
				for !stop.Load() {
					applied := false
					for _, p := range owner(moving) {
						res, err := idem.Transfer(ctx, p, req)
						if err != nil {
							t.Error(err)
							return
						}
						if res.Outcome == idem.Applied || res.Outcome == idem.Replayed {
							applied = true
							break
						}
						if res.Outcome != idem.NotOwner {
							t.Errorf("load: %v", res.Outcome)
							return
						}
					}
					if applied {
						mu.Lock()
						samples[moving] = append(samples[moving], sample{time.Now(), time.Since(begin)})
						acked[req.Key] = req
						mu.Unlock()
						break
					}
					mu.Lock()
					refusals[moving]++
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	if clients > 0 {
		time.Sleep(2 * time.Second)
	}
	moveStart := time.Now()
	var lastReport, granted time.Time
	moves, err := Apply(ctx, c.mapOf(2, "sa=-40 sb=40-"), c.pool, Options{Interval: partition.Daily, Progress: func(p Progress) {
		if p.Phase == PhaseGranted {
			granted = time.Now()
		}
		if p.Phase != PhaseCopying && p.Phase != PhaseCatchingUp || time.Since(lastReport) > time.Second {
			lastReport = time.Now()
			fmt.Printf("  %s\n", FormatProgress(p))
		}
	}})
	moveEnd := time.Now()
	if clients > 0 {
		time.Sleep(time.Second)
	}
	stop.Store(true)
	loadWG.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var rows int64
	for _, mv := range moves {
		rows += mv.Records + mv.Ledger + mv.Credits
	}
	took := moveEnd.Sub(moveStart)
	moved := granted.Sub(moveStart)
	fmt.Printf("bench-move S=%d clients=%d×%d/s: apply %v: granted after %v (%d rows copied: %d records, %d ledger rows, %d owed credits; %.0f rows/s), moved rows deleted from the old owner in %v\n",
		size, clients, rate, took.Round(time.Millisecond), moved.Round(time.Millisecond), rows, moves[0].Records, moves[0].Ledger, moves[0].Credits,
		float64(rows)/moved.Seconds(), moveEnd.Sub(granted).Round(time.Millisecond))
	for _, moving := range []bool{true, false} {
		name := map[bool]string{true: "moving range 40-80", false: "other range -40"}[moving]
		ss := samples[moving]
		if len(ss) == 0 {
			continue
		}
		var before, during []time.Duration
		gap, last := time.Duration(0), moveStart
		for _, s := range ss {
			switch {
			case s.at.Before(moveStart):
				before = append(before, s.latency)
			case !s.at.After(moveEnd):
				during = append(during, s.latency)
				gap = max(gap, s.at.Sub(last))
				last = s.at
			}
		}
		gap = max(gap, moveEnd.Sub(last))
		fmt.Printf("  %s: during the move %d applied, longest time without one %v, %d refusals (no owner), p99 %v (before the move %v)\n",
			name, len(during), gap.Round(time.Millisecond), refusals[moving], p99(during).Round(time.Microsecond), p99(before).Round(time.Microsecond))
	}

	// Every row, on the shard that owns it.
	for key, req := range acked {
		res, err := idem.Transfer(ctx, c.pool(map[bool]string{true: "sb", false: "sa"}[req.KeyspaceID>>62 == 1]), req)
		if err != nil || res.Outcome != idem.Replayed {
			t.Fatalf("retry of %s on its owner: %v %v, want replayed", key, res.Outcome, err)
		}
	}
	var n int
	for shard, q := range map[string]string{
		"sb": `SELECT count(*) FROM idempotency_record r
			WHERE (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = 't-' || r.key) <> 2 - (SELECT count(*) FROM shardgate_credit_outbox o WHERE o.transfer_id = 't-' || r.key)`,
		"sa": `SELECT (SELECT count(*) FROM idempotency_record WHERE keyspace_id >= 0 - 4611686018427387904 AND keyspace_id < 0)
			+ (SELECT count(*) FROM ledger_entries WHERE keyspace_id >= 0 - 4611686018427387904 AND keyspace_id < 0)`,
	} {
		if err := c.pool(shard).QueryRow(ctx, q).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows out of place (%v)", shard, n, err)
		}
	}
	var records int
	if err := c.pool("sb").QueryRow(ctx, "SELECT count(*) FROM idempotency_record").Scan(&records); err != nil {
		t.Fatal(err)
	}
	want := size
	for _, req := range acked {
		if req.KeyspaceID>>62 == 1 {
			want++
		}
	}
	if records != want {
		t.Errorf("sb holds %d records, want %d (seeded and acknowledged in 40-80)", records, want)
	}
}

// benchTransfer is transfer i: from an account in 40-80 (moving) or in -40, to one in 40-80, or
// in 80- (owed: on sb) when away.
func benchTransfer(i int, moving, away bool) idem.TransferRequest {
	r := rand.New(rand.NewPCG(uint64(i), 7))
	ks := r.Uint64() >> 2 // in -40
	if moving {
		ks |= 1 << 62 // in 40-80
	}
	dst := r.Uint64()>>2 | 1<<62
	if away {
		dst = r.Uint64()>>1 | 1<<63
	}
	key := uuid.Must(uuid.NewV7()).String()
	return idem.TransferRequest{
		Scope: "bench:transfer", Key: key, RequestHash: fmt.Sprintf("h-%d", i),
		KeyspaceID: ks, DstKeyspaceID: dst, TransferID: "t-" + key, Client: "bench",
		Src: int64(i), Dst: int64(i + 1), Amount: 100, Currency: "EUR", Retention: 720 * time.Hour,
		Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Sprintf(`{"id":"t-%s"}`, key)},
	}
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}
