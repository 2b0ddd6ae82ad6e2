// Package service assembles a serving router from its configuration: it opens the shards'
// pools, registers the metrics, builds the HTTP server, and runs the background work a router
// process owns (map reloads on file change and SIGHUP, partition upkeep, graceful shutdown). It
// also holds the passes the one-shot commands make over every shard (migrate, maintain, apply).
// `router serve`, `router dev`, the integration suites, the deploy tests and the benchmark all
// build their routers here, so the sequence is written once.
package service

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/relay"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// Service is one router: its configuration, the HTTP server over the shards' pools, and the
// registry its metrics are served from.
type Service struct {
	Config   *config.Config
	Router   *router.Server
	Registry *prometheus.Registry
	Relay    *relay.Relay // nil when relay.enabled is false
	log      *slog.Logger
	upkeep   *idem.UpkeepCollector
	moves    *rangemove.StatusCollector
}

// Load reads router.yaml at path and the shard map it names.
func Load(path string) (*config.Config, *shardmap.Map, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	m, err := shardmap.Load(cfg.ShardmapPath)
	if err != nil {
		return nil, nil, err
	}
	return cfg, m, nil
}

// New opens a pool per shard of m and builds the router serving them. Opening does not
// connect: a shard that is down fails its own requests, not the start. Close releases the pools.
func New(cfg *config.Config, m *shardmap.Map, log *slog.Logger) (*Service, error) {
	// The service's own copy of cfg: the session settings of its connections are its own. With
	// the relay on, it delivers the credits of this router's debits itself, at once, and the
	// router's connections write them leased to it.
	own := *cfg
	cfg = &own
	cfg.ShardPool.Session = nil
	var owner string
	if cfg.Relay.Enabled {
		owner = relay.NewOwner()
		cfg.ShardPool.Session = idem.CreditLeaseSettings(owner, cfg.Relay.Lease)
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		return nil, err
	}
	s := &Service{
		Config:   cfg,
		Registry: prometheus.NewRegistry(),
		log:      log,
		upkeep:   idem.NewUpkeepCollector(cfg.Idempotency.PartitionInterval, cfg.Idempotency.Retention),
	}
	s.moves = &rangemove.StatusCollector{}
	s.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), s.upkeep, s.moves)
	s.Router = router.New(cfg, topo, log, s.Registry)
	if cfg.Relay.Enabled {
		s.Relay = relay.New(cfg, owner, s.Router, log, s.Registry)
		s.Relay.DeliverThrough(s.Router)
		s.Router.OnCreditOwed(s.Relay.Handoff)
	}
	return s, nil
}

// Close closes the pools of the topology serving now, waiting for in-flight requests on them.
func (s *Service) Close() { s.Router.Topology().Close() }
