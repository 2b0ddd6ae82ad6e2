package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/shardmap"
)

const (
	// crossAccounts is how many accounts of each cross shard the cross-shard transfers use.
	crossAccounts = 1 << 16
	// creditWait bounds how long a cross-shard phase waits for the relay to deliver its credits.
	creditWait = time.Minute
)

// crossShards are the two shards of the cross-shard phases, each owning half of the keyspace
// under a map of their own: a database of the first PostgreSQL server and one of the second, so
// that each shard has its own WAL as in production, and the same-shard phases keep their shard.
type crossShards struct {
	names    [2]string // the shards' names in shardMap
	dbs      [2]string // their databases
	dsns     [2]string
	shardMap *shardmap.Map
	accounts [2][]int64 // accounts each shard owns
}

// pick returns a cross-shard transfer's accounts: src anywhere, dst on the other shard.
func (x *crossShards) pick(rng *rand.Rand) (src, dst int64) {
	from := rng.IntN(2)
	return x.accounts[from][rng.IntN(crossAccounts)], x.accounts[1-from][rng.IntN(crossAccounts)]
}

// prepareCross creates and migrates the cross shards' databases, gives each half the keyspace,
// and finds accounts each owns.
func (f *fixture) prepareCross(ctx context.Context) error {
	x := &crossShards{names: [2]string{"shard-x0", "shard-x1"}, dbs: [2]string{"cross_0", "cross_1"}}
	pools := map[string]*pgxpool.Pool{}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	mapYAML := "version: 1\nshards:\n"
	for i, db := range x.dbs {
		if _, err := f.crossAdmin(i).Exec(ctx, "CREATE DATABASE "+db+" OWNER "+pgUser); err != nil {
			return fmt.Errorf("creating the cross shards' database %s: %w", db, err)
		}
		u, err := url.Parse([2]*localpg.Server{f.pg, f.pg2}[i].DSN())
		if err != nil {
			return err
		}
		u.Path = "/" + db
		x.dsns[i] = u.String()
		pool, err := pgxpool.New(ctx, x.dsns[i])
		if err != nil {
			return err
		}
		pools[x.names[i]] = pool
		if _, err := idem.Migrate(ctx, pool); err != nil {
			return fmt.Errorf("migrating %s: %w", db, err)
		}
		if err := f.partition(ctx, pool); err != nil {
			return err
		}
		mapYAML += fmt.Sprintf("  - name: %s\n    dsn: %s\n    ranges: [%q]\n", x.names[i], x.dsns[i], [2]string{"-80", "80-"}[i])
	}
	mapPath := filepath.Join(f.dir, "cross-shardmap.yaml")
	if err := os.WriteFile(mapPath, []byte(mapYAML), 0o600); err != nil {
		return err
	}
	var err error
	if x.shardMap, err = shardmap.Load(mapPath); err != nil {
		return err
	}
	if _, err := rangemove.ApplyMap(ctx, x.shardMap, func(name string) *pgxpool.Pool { return pools[name] }, partition.Daily); err != nil {
		return err
	}
	for id := int64(1); len(x.accounts[0]) < crossAccounts || len(x.accounts[1]) < crossAccounts; id++ {
		sh, _ := x.shardMap.ShardFor(shardmap.KeyspaceID(id))
		i := 0
		if sh.Name == x.names[1] {
			i = 1
		}
		if len(x.accounts[i]) < crossAccounts {
			x.accounts[i] = append(x.accounts[i], id)
		}
	}
	f.cross = x
	return nil
}

// crossCounts are, per cross shard, its debits, credits, transfers' idempotency records and
// credits it still owes.
type crossCounts [2]struct{ debits, credits, records, owed int64 }

// counts reads them, each shard on a connection of its own that is closed at once, so that what
// the cross shards commit during a phase is the router's alone (see commits).
func (x *crossShards) counts(ctx context.Context) (crossCounts, error) {
	var n crossCounts
	for i, dsn := range x.dsns {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return n, err
		}
		err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out'),
			(SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_in'),
			(SELECT count(*) FROM idempotency_record WHERE scope = $1),
			(SELECT count(*) FROM shardgate_credit_outbox WHERE settled_at IS NULL)`, scope).
			Scan(&n[i].debits, &n[i].credits, &n[i].records, &n[i].owed)
		conn.Close(ctx)
		if err != nil {
			return n, fmt.Errorf("counting rows on %s: %w", x.names[i], err)
		}
	}
	return n, nil
}

// commits returns the transactions both cross shards have committed, as pg_stat_database counts
// them, once no client connection to them is open: a backend reports its counts when it exits
// (or now and then while idle), so only then do they hold every commit.
func (f *fixture) commits(ctx context.Context) (int64, error) {
	total := int64(0)
	for i, db := range f.cross.dbs {
		n, err := committed(ctx, f.crossAdmin(i), db)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// crossAdmin is the admin pool of the server of cross shard i.
func (f *fixture) crossAdmin(i int) *pgxpool.Pool { return [2]*pgxpool.Pool{f.admin, f.admin2}[i] }

// committed is what database db of admin's server has committed, once no client connection to
// it is open.
func committed(ctx context.Context, admin *pgxpool.Pool, db string) (int64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var backends, commits int64
		err := admin.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'),
			(SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database WHERE datname = $1)`, db).Scan(&backends, &commits)
		if err != nil {
			return 0, fmt.Errorf("reading pg_stat_database: %w", err)
		}
		if backends == 0 {
			return commits, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d connections to the cross shard %s are still open after 30 s", backends, db)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// measureCross runs a cross-shard phase at concurrency c for d on a router of its own, with its
// relay running: a warm-up, the phase, and the delivery of every credit. It reads the time to
// credit from the relay's histogram over the phase, and the commits per transfer over the
// router's whole life (its start, warm-up, phase and deliveries, its relay's polls). It checks
// the rows: each transfer one debit on its source, one credit on the other shard, one record,
// and nothing left owed.
func (f *fixture) measureCross(ctx context.Context, c int, d time.Duration) (m measurement, err error) {
	x := f.cross
	before, err := x.counts(ctx)
	if err != nil {
		return m, err
	}
	commitsBefore, err := f.commits(ctx)
	if err != nil {
		return m, err
	}
	rt, err := f.startRouterOn(x.shardMap, c, groupCommitOn)
	if err != nil {
		return m, err
	}
	rt.load.pick = x.pick
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		rt.svc.Relay.Run(relayCtx)
	}()
	closed := false
	shut := func() error {
		if closed {
			return nil
		}
		closed = true
		stopRelay()
		<-relayDone
		return rt.close()
	}
	defer shut() //nolint:errcheck // on an error path; the error returned is the one to report

	warm, err := f.runLoad(ctx, rt.server, c, warmup, nil, false)
	if err != nil {
		return m, fmt.Errorf("warming up: %w", err)
	}
	if err := rt.awaitCredits(ctx, warm.txns); err != nil {
		return m, err
	}
	delaysBefore, err := rt.creditDelays()
	if err != nil {
		return m, err
	}
	if m, err = f.runLoad(ctx, rt.server, c, d, nil, false); err != nil {
		return m, err
	}
	total := warm.txns + m.txns
	if err := rt.awaitCredits(ctx, total); err != nil {
		return m, err
	}
	delaysAfter, err := rt.creditDelays()
	if err != nil {
		return m, err
	}
	if m.credit = delaysAfter.minus(delaysBefore); int64(m.credit.count) < m.txns {
		return m, fmt.Errorf("the relay observed the delay of %.0f credits, the phase had %d transfers", m.credit.count, m.txns)
	}
	if err := shut(); err != nil {
		return m, err
	}
	commitsAfter, err := f.commits(ctx)
	if err != nil {
		return m, err
	}
	m.commits, m.committed = commitsAfter-commitsBefore, total

	after, err := x.counts(ctx)
	if err != nil {
		return m, err
	}
	var got crossCounts
	for i := range got {
		got[i].debits = after[i].debits - before[i].debits
		got[i].credits = after[i].credits - before[i].credits
		got[i].records = after[i].records - before[i].records
		got[i].owed = after[i].owed
	}
	if got[0].debits+got[1].debits != total || got[0].records+got[1].records != total ||
		got[0].credits != got[1].debits || got[1].credits != got[0].debits || got[0].owed+got[1].owed != 0 {
		return m, fmt.Errorf("%d cross-shard transfers (warm-up included) added, per shard, %+v; want on each as many debits and records as "+
			"transfers it was the source of, as many credits as the other shard has debits, and none owed", total, got)
	}
	return m, nil
}

// awaitCredits waits until the router's relay has delivered and settled n credits: until it has
// observed the delay of n, which it does once their settle has committed.
func (r *routerServer) awaitCredits(ctx context.Context, n int64) error {
	deadline := time.Now().Add(creditWait)
	for {
		h, err := r.creditDelays()
		delivered := h.count
		if err != nil || delivered >= float64(n) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay delivered %.0f of %d credits in %v", delivered, n, creditWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// delays is a histogram of times to credit, summed over destination shards: its buckets' upper
// bounds in seconds, their cumulative counts, and the count of all.
type delays struct {
	bounds, cumulative []float64
	count              float64
}

// creditDelays reads shardgate_credit_delay_seconds from the router's metrics.
func (r *routerServer) creditDelays() (delays, error) {
	mfs, err := r.svc.Registry.Gather()
	if err != nil {
		return delays{}, fmt.Errorf("reading the router's metrics: %w", err)
	}
	var h delays
	for _, mf := range mfs {
		if mf.GetName() != "shardgate_credit_delay_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			hist := m.GetHistogram()
			h.count += float64(hist.GetSampleCount())
			bs := hist.GetBucket()
			if h.bounds == nil {
				h.bounds, h.cumulative = make([]float64, len(bs)), make([]float64, len(bs))
				for i, b := range bs {
					h.bounds[i] = b.GetUpperBound()
				}
			}
			for i, b := range bs {
				h.cumulative[i] += float64(b.GetCumulativeCount())
			}
		}
	}
	return h, nil
}

func (h delays) plus(o delays) delays {
	if h.bounds == nil {
		h.bounds = o.bounds
		h.cumulative = make([]float64, len(o.cumulative))
	}
	out := delays{bounds: h.bounds, cumulative: make([]float64, len(h.cumulative)), count: h.count + o.count}
	for i := range out.cumulative {
		out.cumulative[i] = h.cumulative[i]
		if i < len(o.cumulative) {
			out.cumulative[i] += o.cumulative[i]
		}
	}
	return out
}

func (h delays) minus(o delays) delays {
	neg := delays{bounds: o.bounds, cumulative: make([]float64, len(o.cumulative)), count: -o.count}
	for i, c := range o.cumulative {
		neg.cumulative[i] = -c
	}
	return h.plus(neg)
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile does: linearly within the
// bucket it falls in (from 0 in the first); the highest bound if it falls beyond them. ok is false
// when the histogram is empty.
func (h delays) quantile(q float64) (d time.Duration, ok bool) {
	if h.count == 0 {
		return 0, false
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, upper := range h.bounds {
		if h.cumulative[i] >= rank {
			frac := 0.0
			if in := h.cumulative[i] - below; in > 0 {
				frac = (rank - below) / in
			}
			return time.Duration((lower + (upper-lower)*frac) * float64(time.Second)), true
		}
		lower, below = upper, h.cumulative[i]
	}
	return time.Duration(h.bounds[len(h.bounds)-1] * float64(time.Second)), true
}

func TestDelaysQuantile(t *testing.T) {
	// 10 observations up to 1 ms, 80 in (1 ms, 2 ms], 10 in (2 ms, 5 ms], none beyond.
	h := delays{bounds: []float64{.001, .002, .005}, cumulative: []float64{10, 90, 100}, count: 100}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{
		{0.05, 500 * time.Microsecond},  // halfway through the first bucket, from 0
		{0.50, 1500 * time.Microsecond}, // halfway through the second
		{0.99, 4700 * time.Microsecond}, // 9 of the third's 10
		{1, 5 * time.Millisecond},
	} {
		if got, ok := h.quantile(tt.q); !ok || (got-tt.want).Abs() > time.Microsecond {
			t.Errorf("quantile(%v) = %v, %t; want %v", tt.q, got, ok, tt.want)
		}
	}
	over := delays{bounds: h.bounds, cumulative: []float64{0, 0, 0}, count: 3}
	if got, _ := over.quantile(0.5); got != 5*time.Millisecond {
		t.Errorf("a quantile beyond every bucket = %v, want the highest bound, 5ms", got)
	}
	if _, ok := (delays{}).quantile(0.5); ok {
		t.Error("an empty histogram has a quantile")
	}
	phase := h.plus(h).minus(h)
	if phase.count != 100 || phase.cumulative[1] != 90 {
		t.Errorf("h + h - h = %+v, want %+v", phase, h)
	}
	if sum := (delays{}).plus(h); sum.count != 100 || sum.cumulative[2] != 100 {
		t.Errorf("empty + h = %+v, want %+v", sum, h)
	}
}
