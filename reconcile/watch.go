package reconcile

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// Topologies is what the periodic check needs of the router it runs in.
type Topologies interface {
	// HoldTopology returns the current topology, held until its Release.
	HoldTopology() *topology.Topology
}

// Watcher is the periodic check of `router serve`: every reconcile.interval, the one router of
// the fleet that holds the watch lock checks the transfers debited in the last
// reconcile.window and exports what it found. Another router takes over when the holder stops
// (its session, and so its lock, ends).
type Watcher struct {
	cfg     config.Reconcile
	pool    config.ShardPool
	topos   Topologies
	log     *slog.Logger
	metrics *watchMetrics
	lock    *watchLock // nil while another router checks
}

// watchLock is the watch lock held: a connection of its own, outside the router's pools, so that
// a map reload never waits for it.
type watchLock struct {
	shard shardmap.Shard
	pool  *pgxpool.Pool
	conn  *pgxpool.Conn
}

// NewWatcher makes the periodic check of the router whose configuration is cfg; its metrics go
// to reg. Run runs it.
func NewWatcher(cfg *config.Config, topos Topologies, log *slog.Logger, reg prometheus.Registerer) *Watcher {
	return &Watcher{cfg: cfg.Reconcile, pool: cfg.ShardPool, topos: topos, log: log, metrics: newWatchMetrics(reg)}
}

// Run checks every reconcile.interval until ctx ends, then gives up the watch lock.
func (w *Watcher) Run(ctx context.Context) {
	defer w.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.cfg.Interval):
		}
		w.Check(ctx)
	}
}

// Close gives up the watch lock, if held: another router checks from its next turn.
func (w *Watcher) Close() {
	if w.lock != nil {
		w.lock.conn.Release()
		w.lock.pool.Close()
		w.lock = nil
	}
	w.metrics.leader.Set(0)
}

// Check makes one check if this router holds the watch lock or takes it now, and reports
// whether it did. A router that does not check exports no discrepancy figures: those of the one
// that checks are the fleet's.
func (w *Watcher) Check(ctx context.Context) bool {
	topo := w.topos.HoldTopology()
	defer topo.Release()
	if !w.lead(ctx, topo.Map) {
		w.metrics.discrepancies.Reset()
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Interval)
	defer cancel()
	w.metrics.lastRun.SetToCurrentTime()
	r, err := Run(ctx, topo.Map, topo.Pool, Options{Window: w.cfg.Window})
	if err != nil {
		w.metrics.runs.WithLabelValues("error").Inc()
		w.log.Warn("periodic reconcile could not check the ledgers; it tries again next interval", "err", err)
		return true
	}
	w.metrics.lastSuccess.SetToCurrentTime()
	for _, k := range Kinds {
		w.metrics.discrepancies.WithLabelValues(kindLabel(k)).Set(float64(r.Found[k]))
	}
	w.metrics.discrepancies.WithLabelValues("unbalanced_currency").Set(float64(r.Unbalanced()))
	if r.Clean() {
		w.metrics.runs.WithLabelValues("clean").Inc()
		return true
	}
	w.metrics.runs.WithLabelValues("discrepancies").Inc()
	attrs := []any{"window", w.cfg.Window.String(), "unbalanced_currencies", r.Unbalanced()}
	for _, k := range Kinds {
		if r.Found[k] > 0 {
			var ids []string
			for _, d := range r.Listed[k] {
				ids = append(ids, d.Leg.TransferID+"@"+d.Leg.Shard)
			}
			attrs = append(attrs, kindLabel(k), r.Found[k], kindLabel(k)+"_oldest", strings.Join(ids, ","))
		}
	}
	w.log.Error("LEDGER DISCREPANCY: the shards' ledgers do not add up; run `router reconcile` for the report, and `router reconcile --repair` for missing credits", attrs...)
	return true
}

// lead reports whether this router holds the watch lock on m's first shard by name, taking it
// if it can. A lock held on another shard (the map changed) or over a dead session is given up.
func (w *Watcher) lead(ctx context.Context, m *shardmap.Map) bool {
	first := slices.MinFunc(m.Shards, func(a, b shardmap.Shard) int { return strings.Compare(a.Name, b.Name) })
	if l := w.lock; l != nil {
		if l.shard.Name == first.Name && l.shard.DSN == first.DSN && l.conn.Ping(ctx) == nil {
			return true
		}
		w.Close()
	}
	sp := w.pool
	sp.MaxConns = 1
	pool, err := topology.OpenPool(first, sp)
	if err != nil {
		w.log.Warn("periodic reconcile: cannot open the shard that holds the watch lock", "shard", first.Name, "err", first.Scrub(err.Error()))
		return false
	}
	conn, err := pool.Acquire(ctx)
	var locked bool
	if err == nil {
		err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", idem.LockClass, idem.LockWatch).Scan(&locked)
	}
	if err != nil || !locked {
		if err != nil {
			w.log.Warn("periodic reconcile: cannot reach the shard that holds the watch lock", "shard", first.Name, "err", first.Scrub(err.Error()))
		}
		if conn != nil {
			conn.Release()
		}
		pool.Close()
		return false
	}
	w.lock = &watchLock{shard: first, pool: pool, conn: conn}
	w.metrics.leader.Set(1)
	w.log.Info("periodic reconcile: this router checks the ledgers for the fleet", "shard_with_lock", first.Name,
		"interval", w.cfg.Interval.String(), "window", w.cfg.Window.String())
	return true
}

// kindLabel is a kind as a metric label: "missing credit" is missing_credit.
func kindLabel(k Kind) string {
	return map[Kind]string{MissingCredit: "missing_credit", OrphanCredit: "credit_without_debit", Mismatch: "credit_differs", Duplicate: "duplicate"}[k]
}

// watchMetrics are the periodic check's series. The alert on a discrepancy
// (deploy/prometheus/rules.yml) reads shardgate_reconcile_discrepancies.
type watchMetrics struct {
	discrepancies        *prometheus.GaugeVec
	runs                 *prometheus.CounterVec
	lastRun, lastSuccess prometheus.Gauge
	leader               prometheus.Gauge
}

func newWatchMetrics(reg prometheus.Registerer) *watchMetrics {
	m := &watchMetrics{
		discrepancies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardgate_reconcile_discrepancies",
			Help: "Discrepancies the last periodic check found, by kind: missing_credit, credit_without_debit, credit_differs, duplicate, unbalanced_currency. Exported only by the router that checks.",
		}, []string{"kind"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_reconcile_runs_total",
			Help: "Periodic checks this router made, by result: clean, discrepancies, error.",
		}, []string{"result"}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardgate_reconcile_last_run_timestamp_seconds",
			Help: "When this router last began a periodic check (Unix time); 0 if never.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardgate_reconcile_last_success_timestamp_seconds",
			Help: "When this router last completed a periodic check, whatever it found (Unix time); 0 if never.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardgate_reconcile_leader",
			Help: "1 while this router holds the watch lock and runs the fleet's periodic check, else 0.",
		}),
	}
	reg.MustRegister(m.discrepancies, m.runs, m.lastRun, m.lastSuccess, m.leader)
	return m
}
