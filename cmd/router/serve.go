package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// mapPollInterval is how often serve looks at the shard map file. A variable so that a test can
// take the file watch out of the way of SIGHUP.
var mapPollInterval = time.Second

// Timings of serve's background work.
const (
	upkeepInterval  = time.Hour
	upkeepRetry     = time.Minute
	shutdownTimeout = 30 * time.Second
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

// serveOn is serve on a given listener. ready, if not nil, is called once the router accepts
// requests.
func serveOn(ctx context.Context, ln net.Listener, cfg *config.Config, m *shardmap.Map, log *slog.Logger, ready func(addr string)) error {
	if cfg.Auth.Mode == "none" {
		log.Warn("AUTHENTICATION IS OFF (auth.mode: none): every request is the client \"anonymous\"; use this for local development only")
	}
	if cfg.Admin.Listen == "" && cfg.Admin.TokenSHA256 == nil {
		log.Warn("/metrics and /admin/* are served without credentials on the API listener; set admin.listen or admin.token_sha256 to protect them")
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		ln.Close()
		return err
	}
	reg := prometheus.NewRegistry()
	upkeepStats := idem.NewUpkeepCollector(cfg.Idempotency.PartitionInterval, cfg.Idempotency.Retention)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), upkeepStats)
	srv := router.New(cfg, topo, log, reg)

	reloadNow := make(chan struct{}, 1)
	trigger := func() {
		select {
		case reloadNow <- struct{}{}:
		default: // a reload is already pending
		}
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	go watchMap(bg, cfg.ShardmapPath, mapPollInterval, trigger)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-bg.Done():
				return
			case <-hup:
				trigger()
			case <-reloadNow:
				srv.Reload(cfg.ShardmapPath) //nolint:errcheck // Reload logs and counts its result
			}
		}
	}()
	go func() {
		for {
			t := srv.Topology() // one topology for both map and pools
			next := upkeepInterval
			if err := upkeep(bg, cfg, t.Map, t.Pool, logWriter{log}, upkeepStats); err != nil {
				next = upkeepRetry // logged per shard; try again soon, not in an hour
			}
			select {
			case <-bg.Done():
				return
			case <-time.After(next):
			}
		}
	}()

	hs := httpServer(cfg, srv, log)
	if hs.TLSConfig, err = serverTLS(cfg.TLS); err != nil {
		ln.Close()
		srv.Topology().Close()
		return err
	}
	errc := make(chan error, 2)
	go func() {
		if cfg.TLS.CertFile != "" {
			errc <- hs.ServeTLS(ln, cfg.TLS.CertFile, cfg.TLS.KeyFile)
			return
		}
		errc <- hs.Serve(ln)
	}()
	var admin *http.Server
	if cfg.Admin.Listen != "" {
		aln, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			hs.Close()
			srv.Topology().Close()
			return fmt.Errorf("admin.listen: %w", err)
		}
		admin = httpServer(cfg, srv.AdminHandler(), log)
		go func() { errc <- admin.Serve(aln) }()
		log.Info("admin endpoints (/metrics, /admin/*) served separately", "addr", aln.Addr().String())
	}
	log.Info("serving", "addr", ln.Addr().String(), "shardmap_version", m.Version, "shards", len(m.Shards))
	if ready != nil {
		ready(ln.Addr().String())
	}

	select {
	case err := <-errc:
		srv.Topology().Close()
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: no new connections; finishing in-flight requests")
	stopBG()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = hs.Shutdown(sctx)
	if admin != nil {
		admin.Shutdown(sctx) //nolint:errcheck // the API server's result is the one that matters
	}
	srv.Topology().Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// httpServer applies the configured limits to one listener's server.
func httpServer(cfg *config.Config, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       cfg.HTTP.ReadTimeout,
		WriteTimeout:      cfg.HTTP.WriteTimeout,
		IdleTimeout:       cfg.HTTP.IdleTimeout,
		MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serverTLS builds the API listener's TLS settings: nil without a certificate; with a client
// CA, every client must present a certificate it signed (mutual TLS).
func serverTLS(c config.TLS) (*tls.Config, error) {
	if c.CertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.client_ca_file %s: no PEM certificate found", c.ClientCAFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// watchMap calls changed whenever the content of the map file differs from what it was at the
// previous look. The first look always calls it: the map serve started with was read before
// this watch began, and the file may have changed in between (the reload that follows is a
// no-op when it did not). Comparing content rather than size and modification time also sees
// an edit that keeps the size within the file system's timestamp granularity. Polling needs no
// extra dependency and also sees a file replaced by a rename (as editors and Kubernetes
// ConfigMap updates do).
func watchMap(ctx context.Context, path string, every time.Duration, changed func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if d := fileDigest(path); d != last && d != "" {
				last = d
				changed()
			}
		}
	}
}

// fileDigest is the SHA-256 of a file's content, or "" if it is unreadable.
func fileDigest(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// logWriter turns upkeep's per-shard report lines into log records.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("partition upkeep", "report", string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}

var _ io.Writer = logWriter{}
