package router

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/topology"
)

// Outcome labels of shardgate_transfers_total.
const (
	outApplied          = "applied"
	outReplayed         = "replayed"
	outInProgress       = "in_progress"
	outKeyReused        = "key_reused"
	outKeyExpired       = "key_expired"
	outRejected         = "rejected"          // refused before reaching a shard (400, 401, 413, 415)
	outShardUnavailable = "shard_unavailable" // 503: the outcome on the shard is unknown or nothing was done
	outShardBusy        = "shard_busy"        // 503: the shard's connections and wait queue are full
	outNotOwner         = "not_owner"         // 503: the shard refused a key range it does not own
	outRecordMissing    = "record_missing"    // 503: the key's debit is in the ledger, its record is not
	outError            = "error"             // 500
)

// metrics are the router's Prometheus series. The replay rate the guide asks for is
// rate(shardgate_transfers_total{outcome="replayed"}); deploy/prometheus records it as
// shardgate:replay_ratio:rate5m.
type metrics struct {
	buffer         bufferMetrics // of requests held while their key range moves (buffer.go)
	transfers      *prometheus.CounterVec
	shardTime      *prometheus.HistogramVec
	reloads        *prometheus.CounterVec
	recordsMissing *prometheus.CounterVec
	identities     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, topo *atomic.Pointer[topology.Topology]) *metrics {
	m := &metrics{
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_transfers_total",
			Help: "POST /transfers requests by outcome and owning shard (shard is empty when the request was rejected before routing).",
		}, []string{"outcome", "shard"}),
		shardTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shardgate_shard_request_duration_seconds",
			Help:    "Time of one transfer's round trip on its shard, by shard and outcome.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"shard", "outcome"}),
	}
	m.buffer = newBufferMetrics(reg)
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardgate_shardmap_reloads_total",
		Help: "Shard map reloads by result (applied, unchanged, refused).",
	}, []string{"result"})
	// Also in shardgate_transfers_total{outcome="record_missing"}, but kept apart by shard so that
	// an alert can say which shard lost records, and so that it exists before the first one does.
	m.recordsMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardgate_idempotency_records_missing_total",
		Help: "Transfers whose debit is in the shard's ledger, younger than retention, but whose idempotency record is missing (a partition detached by hand, say); answered 503 idempotency-record-missing.",
	}, []string{"shard"})
	m.identities = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardgate_shard_identity_changes_total",
		Help: "Times a shard's new connection reached a database other than the one its connections reached before (another system identifier or timeline: a promoted standby, a restore).",
	}, []string{"shard"})
	reg.MustRegister(m.transfers, m.shardTime, m.reloads, m.recordsMissing, m.identities, &poolCollector{topo: topo})
	return m
}

// poolCollector reports pgxpool statistics of the live topology's pools at scrape time.
type poolCollector struct {
	topo *atomic.Pointer[topology.Topology]
}

var (
	poolConns = prometheus.NewDesc("shardgate_pool_connections",
		"Connections in the shard's pool by state (acquired, idle, constructing).", []string{"shard", "state"}, nil)
	poolMax = prometheus.NewDesc("shardgate_pool_max_connections",
		"Maximum size of the shard's pool.", []string{"shard"}, nil)
	poolAcquires = prometheus.NewDesc("shardgate_pool_acquires_total",
		"Connections acquired from the shard's pool.", []string{"shard"}, nil)
	poolEmptyAcquires = prometheus.NewDesc("shardgate_pool_empty_acquires_total",
		"Acquires that had to wait for a connection (pool exhausted or empty).", []string{"shard"}, nil)
	poolAcquireWait = prometheus.NewDesc("shardgate_pool_acquire_wait_seconds_total",
		"Total time spent waiting for a connection from the shard's pool.", []string{"shard"}, nil)
	mapVersion = prometheus.NewDesc("shardgate_shardmap_version",
		"Version of the shard map this router is serving.", nil, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolConns, poolMax, poolAcquires, poolEmptyAcquires, poolAcquireWait, mapVersion} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.topo.Load()
	if t == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(mapVersion, prometheus.GaugeValue, float64(t.Map.Version))
	t.Each(func(name string, c *topology.Shard) {
		st := c.Pool.Stat()
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.AcquiredConns()), name, "acquired")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.IdleConns()), name, "idle")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.ConstructingConns()), name, "constructing")
		ch <- prometheus.MustNewConstMetric(poolMax, prometheus.GaugeValue, float64(st.MaxConns()), name)
		ch <- prometheus.MustNewConstMetric(poolAcquires, prometheus.CounterValue, float64(st.AcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolEmptyAcquires, prometheus.CounterValue, float64(st.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolAcquireWait, prometheus.CounterValue, st.AcquireDuration().Seconds(), name)
	})
}
