package router

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/groupcommit"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/topology"
)

type batcher = groupcommit.Batcher[idem.TransferRequest, idem.TransferResult]

// committers sends each shard's concurrent new transfers as groups (group_commit.max_batch),
// one committer per shard connection, kept as long as the connection is.
type committers struct {
	cfg      config.GroupCommit
	timeout  time.Duration // of one group's statement, as of one lone transfer's
	maxConns int32         // of each shard's pool
	size     *prometheus.HistogramVec
	wait     *prometheus.HistogramVec
	stalls   *prometheus.CounterVec
	byShard  sync.Map // *topology.Shard → *batcher
}

func newCommitters(cfg *config.Config, reg prometheus.Registerer) *committers {
	c := &committers{
		cfg:      cfg.GroupCommit,
		timeout:  cfg.ShardPool.RequestTimeout,
		maxConns: cfg.ShardPool.MaxConns,
		size: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shardgate_group_commit_size",
			Help:    "Transfers per group sent to a shard in one statement and one commit.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000},
		}, []string{"shard"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shardgate_group_commit_wait_seconds",
			Help:    "Time a transfer waited to join a group (while the shard's earlier groups were in flight).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"shard"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_group_commit_stalls_total",
			Help: "Groups still in flight after group_commit.stall_after, which let the shard's next group go beside them.",
		}, []string{"shard"}),
	}
	reg.MustRegister(c.size, c.wait, c.stalls)
	return c
}

// transfer runs req on the shard behind conn: alone when group commit is off, else as part of
// the next group of that shard.
func (c *committers) transfer(ctx context.Context, shard string, conn *topology.Shard, req idem.TransferRequest) (idem.TransferResult, error) {
	if c.cfg.MaxBatch <= 1 {
		ctx, check := topology.WatchCommits(ctx)
		res, err := idem.Transfer(ctx, conn.Pool, req)
		if err == nil {
			err = check()
		}
		return res, err
	}
	b, ok := c.byShard.Load(conn)
	if !ok {
		b, _ = c.byShard.LoadOrStore(conn, c.newBatcher(shard, conn.Pool))
	}
	return b.(*batcher).Do(ctx, req)
}

// forget drops the committers of connections that t no longer has.
func (c *committers) forget(t *topology.Topology) {
	c.byShard.Range(func(k, _ any) bool {
		found := false
		t.Each(func(_ string, s *topology.Shard) { found = found || s == k })
		if !found {
			c.byShard.Delete(k)
		}
		return true
	})
}

func (c *committers) newBatcher(shard string, pool *pgxpool.Pool) *batcher {
	size, wait := c.size.WithLabelValues(shard), c.wait.WithLabelValues(shard)
	return groupcommit.New(groupcommit.Options{
		MaxBatch: c.cfg.MaxBatch,
		// Each group in flight holds one of the shard's connections.
		Parallel:    min(c.cfg.InFlight, int(c.maxConns)),
		MaxParallel: min(c.cfg.MaxInFlight, int(c.maxConns)),
		StallAfter:  c.cfg.StallAfter,
		OnStall:     c.stalls.WithLabelValues(shard).Inc,
		Observe: func(n int, waited []time.Duration) {
			size.Observe(float64(n))
			for _, w := range waited {
				wait.Observe(w.Seconds())
			}
		},
	}, func(items []idem.TransferRequest) []groupcommit.Result[idem.TransferResult] {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		return flushGroup(ctx, pool, items)
	})
}

// flushGroup sends items as one group. A group that failed with a PostgreSQL error committed
// nothing (the statement's transaction rolled back), so each item is then sent alone and gets
// the answer a lone attempt gets. Any other failure leaves the group's outcome unknown, and every
// item gets that error: its client is told to retry with the same key. So does every item of a
// commit that stopped waiting for the shard's synchronous standby (topology.ErrNotReplicated):
// it is on the primary only, and a failover now would lose it.
func flushGroup(ctx context.Context, pool *pgxpool.Pool, items []idem.TransferRequest) []groupcommit.Result[idem.TransferResult] {
	ctx, check := topology.WatchCommits(ctx)
	out := sendGroup(ctx, pool, items)
	if err := check(); err != nil {
		for i := range out {
			if out[i].Err == nil {
				out[i] = groupcommit.Result[idem.TransferResult]{Err: err}
			}
		}
	}
	return out
}

// sendGroup is flushGroup without the check of the commits' synchronous replication.
func sendGroup(ctx context.Context, pool *pgxpool.Pool, items []idem.TransferRequest) []groupcommit.Result[idem.TransferResult] {
	out := make([]groupcommit.Result[idem.TransferResult], len(items))
	if len(items) == 1 {
		out[0].Value, out[0].Err = idem.Transfer(ctx, pool, items[0])
		return out
	}
	results, err := idem.TransferBatch(ctx, pool, items)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		for i, r := range results {
			out[i].Value = r
		}
	case errors.As(err, &pgErr):
		var wg sync.WaitGroup
		for i, it := range items {
			wg.Go(func() { out[i].Value, out[i].Err = idem.Transfer(ctx, pool, it) })
		}
		wg.Wait()
	default:
		for i := range out {
			out[i].Err = err
		}
	}
	return out
}
