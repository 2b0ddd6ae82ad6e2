package idem

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/partition"
)

// UpkeepCollector exports, per shard, what the last passes of Upkeep found: the metrics that
// deploy/prometheus/rules.yml alerts on. It keeps the last observed state per shard, fed by
// Record, and computes ages at scrape time, so a scrape never touches a shard. Every router
// exports its own view; alert rules aggregate over routers (max of the last success, min of
// the oldest partition's age).
type UpkeepCollector struct {
	interval  partition.Interval
	retention time.Duration
	now       func() time.Time // the scrape's clock; a variable for tests

	mu     sync.Mutex
	shards map[string]*upkeepSeen
}

// upkeepSeen is what Record learned about one shard.
type upkeepSeen struct {
	state       PartitionState // zero until a pass succeeded
	lastSuccess time.Time      // zero until a pass succeeded
}

var _ prometheus.Collector = (*UpkeepCollector)(nil)

// The series of UpkeepCollector.
var (
	upkeepOldestAge = prometheus.NewDesc("shardgate_idempotency_oldest_partition_age_seconds",
		"Age of the lower bound of the shard's oldest idempotency_record partition, as of the last successful upkeep; above retention plus two intervals means expired partitions are not being dropped.",
		[]string{"shard"}, nil)
	upkeepFuture = prometheus.NewDesc("shardgate_idempotency_future_partitions",
		"idempotency_record partitions on the shard that start after now: below 1 means transfers fail once the current partition ends.",
		[]string{"shard"}, nil)
	upkeepLastSuccess = prometheus.NewDesc("shardgate_upkeep_last_success_timestamp_seconds",
		"Unix time of this router's last successful partition upkeep on the shard; 0 if none succeeded since it started.",
		[]string{"shard"}, nil)
	upkeepRows = prometheus.NewDesc("shardgate_idempotency_rows",
		"Estimated idempotency records on the shard (pg_class.reltuples summed over partitions) at the last successful upkeep.",
		[]string{"shard"}, nil)
	upkeepBytes = prometheus.NewDesc("shardgate_idempotency_bytes",
		"Size of the shard's idempotency_record partitions with their indexes and TOAST (pg_total_relation_size) at the last successful upkeep.",
		[]string{"shard"}, nil)
	upkeepUnchecked = prometheus.NewDesc("shardgate_idempotency_unchecked_partitions",
		"idempotency_record partitions that every key lookup on the shard reads, whatever the key's time (they begin before shardgate_record_floor.unchecked_before), at the last successful upkeep: after the upgrade to migration 0006, upkeep brings them under the key-floor rule and this falls to 0.",
		[]string{"shard"}, nil)
	upkeepRetention = prometheus.NewDesc("shardgate_idempotency_retention_seconds",
		"Configured key retention (idempotency.retention).", nil, nil)
	upkeepInterval = prometheus.NewDesc("shardgate_idempotency_partition_interval_seconds",
		"Longest time one idempotency_record partition covers (86400 for daily, 31 days for monthly).", nil, nil)
)

// NewUpkeepCollector returns a collector for routers configured with partition interval iv and
// key retention; both are exported too, so alert rules need not repeat router.yaml.
func NewUpkeepCollector(iv partition.Interval, retention time.Duration) *UpkeepCollector {
	return &UpkeepCollector{interval: iv, retention: retention, now: time.Now, shards: map[string]*upkeepSeen{}}
}

// Record takes the result of one Upkeep on shard. A successful pass sets the shard's state and
// its last success; a failed one only makes the shard known (last success 0 until one succeeds);
// a skipped one changes nothing, since another upkeep did the work and this router cannot vouch
// for it. A nil collector records nothing, so callers without metrics can pass nil.
func (c *UpkeepCollector) Record(shard string, r UpkeepReport, err error) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.shards[shard]
	if s == nil {
		s = &upkeepSeen{}
		c.shards[shard] = s
	}
	if err == nil && !r.Skipped {
		s.state = r.State
		s.lastSuccess = c.now()
	}
}

// Retain forgets every shard not in shards, so that a shard removed from the map stops being
// reported (and alerted on). A nil collector does nothing.
func (c *UpkeepCollector) Retain(shards []string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.shards {
		if !slices.Contains(shards, name) {
			delete(c.shards, name)
		}
	}
}

// Describe implements prometheus.Collector.
func (c *UpkeepCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{upkeepOldestAge, upkeepFuture, upkeepLastSuccess, upkeepRows, upkeepBytes, upkeepUnchecked, upkeepRetention, upkeepInterval} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *UpkeepCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(upkeepRetention, prometheus.GaugeValue, c.retention.Seconds())
	ch <- prometheus.MustNewConstMetric(upkeepInterval, prometheus.GaugeValue, c.interval.Longest().Seconds())
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for shard, s := range c.shards {
		var last float64
		if !s.lastSuccess.IsZero() {
			last = float64(s.lastSuccess.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(upkeepLastSuccess, prometheus.GaugeValue, last, shard)
		if s.state.ReadAt.IsZero() {
			continue
		}
		future := 0
		for _, p := range s.state.Partitions {
			if p.From.After(now) {
				future++
			}
		}
		ch <- prometheus.MustNewConstMetric(upkeepFuture, prometheus.GaugeValue, float64(future), shard)
		if len(s.state.Partitions) > 0 {
			oldest := s.state.Partitions[0].From
			ch <- prometheus.MustNewConstMetric(upkeepOldestAge, prometheus.GaugeValue, now.Sub(oldest).Seconds(), shard)
		}
		unchecked := 0
		for _, p := range s.state.Partitions {
			if s.state.UncheckedBefore.IsZero() || p.From.Before(s.state.UncheckedBefore) {
				unchecked++
			}
		}
		ch <- prometheus.MustNewConstMetric(upkeepUnchecked, prometheus.GaugeValue, float64(unchecked), shard)
		ch <- prometheus.MustNewConstMetric(upkeepRows, prometheus.GaugeValue, float64(s.state.Rows), shard)
		ch <- prometheus.MustNewConstMetric(upkeepBytes, prometheus.GaugeValue, float64(s.state.Bytes), shard)
	}
}
