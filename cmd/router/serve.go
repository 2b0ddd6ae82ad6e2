package main

import (
	"context"
	"log/slog"
	"net"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/shardmap"
)

// serve runs the API until ctx ends, then stops accepting, lets in-flight requests finish and
// closes the pools.
func serve(ctx context.Context, cfg *config.Config, m *shardmap.Map, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	return serveOn(ctx, ln, cfg, m, log, nil)
}

// serveOn is serve on a given listener, with the periodic reconcile when enabled. ready, if not nil, is called once the router accepts
// requests.
func serveOn(ctx context.Context, ln net.Listener, cfg *config.Config, m *shardmap.Map, log *slog.Logger, ready func(addr string)) error {
	svc, err := service.New(cfg, m, log)
	if err != nil {
		ln.Close()
		return err
	}
	if cfg.Reconcile.Enabled {
		// One router of the fleet at a time checks; a check under way is cancelled with ctx.
		go reconcile.NewWatcher(cfg, svc.Router, log, svc.Registry).Run(ctx)
	}
	return svc.Run(ctx, ln, ready)
}
