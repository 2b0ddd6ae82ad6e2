package relay

import "github.com/prometheus/client_golang/prometheus"

// metrics are the relay's series. The alert on credits owed too long
// (deploy/prometheus/rules.yml) reads shardgate_credit_oldest_owed_age_seconds, the one on slow
// credits shardgate_credit_delay_seconds.
type metrics struct {
	delay      *prometheus.HistogramVec
	owed       *prometheus.GaugeVec
	oldest     *prometheus.GaugeVec
	deliveries *prometheus.CounterVec
	takenOver  *prometheus.CounterVec
	reowed     *prometheus.CounterVec
	// handoffsSkipped counts credits left to a pass because too many handoffs were in flight.
	handoffsSkipped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		owed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardgate_credits_owed",
			Help: "Credits the shard's debits owe and the relay has not delivered yet (refreshed every relay.poll_interval).",
		}, []string{"shard"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardgate_credit_oldest_owed_age_seconds",
			Help: "Age of the oldest credit the shard owes, from its debit; 0 when none is owed.",
		}, []string{"shard"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_credit_deliveries_total",
			Help: "Credit deliveries by destination shard and outcome: settled (written now), replayed (written by an earlier delivery), in_progress, not_owner, conflict, error.",
		}, []string{"shard", "outcome"}),
		takenOver: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_credit_leases_taken_over_total",
			Help: "Owed credits claimed after another relay's lease on them ran out (that relay died or stalled), by the debit's shard.",
		}, []string{"shard"}),
	}
	m.delay = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shardgate_credit_delay_seconds",
		Help: "Time from a debit's commit on its shard until its credit is in the destination shard's ledger, by destination shard: as the router saw both commits for a credit it delivered at once, from the two shards' ledgers for one a relay's pass delivered.",
		// 1 ms to 10 s, fine around the 50 ms target and the 1 s alert threshold.
		Buckets: []float64{.001, .002, .003, .005, .0075, .01, .015, .02, .03, .05, .075, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10},
	}, []string{"shard"})
	m.reowed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardgate_credits_reowed_total",
		Help: "Settled credits owed again because their destination shard became another database (a failover, a restore) within relay.reowe_window of their settling, by destination shard.",
	}, []string{"shard"})
	m.handoffsSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shardgate_credit_handoffs_skipped_total",
		Help: "Credits of this router's debits not delivered at once because too many were in flight (4 × relay.batch); a relay's pass delivers them once their lease (relay.lease) runs out.",
	})
	reg.MustRegister(m.delay, m.owed, m.oldest, m.deliveries, m.takenOver, m.reowed, m.handoffsSkipped)
	return m
}
