package service

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shardgate/shardgate/config"
)

// MapPollInterval is how often a running router looks at the shard map file. A variable so that
// a test can take the file watch out of the way of SIGHUP.
var MapPollInterval = time.Second

// Timings of the background work.
const (
	upkeepInterval  = time.Hour
	upkeepRetry     = time.Minute
	shutdownTimeout = 30 * time.Second
)

// Run serves the API on ln (and the admin endpoints on their own listener when configured)
// until ctx ends, with the map reload and upkeep loops running; then it stops accepting, lets
// in-flight requests finish and closes the pools. ready, if not nil, is called once the router
// accepts requests.
func (s *Service) Run(ctx context.Context, ln net.Listener, ready func(addr string)) error {
	s.warnUnprotected()
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	// SIGHUP is caught from here on, before the router says it is ready: an operator's reload
	// right after start must not kill it (Go's default for SIGHUP is to exit).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go s.reloadLoop(bg, hup)
	go s.upkeepLoop(bg)
	go s.moveStatusLoop(bg)
	if s.Relay != nil {
		go s.Relay.Run(bg)
	}

	errc := make(chan error, 2)
	api, err := s.serveAPI(ln, errc)
	if err != nil {
		ln.Close()
		s.Close()
		return err
	}
	admin, err := s.serveAdmin(errc)
	if err != nil {
		api.Close()
		s.Close()
		return err
	}
	s.log.Info("serving", "addr", ln.Addr().String(), "shardmap_version", s.Router.Topology().Map.Version, "shards", len(s.Router.Topology().Map.Shards))
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	stopBG()
	return s.shutdown(api, admin)
}

// warnUnprotected says loudly at start what is open that should not be in production.
func (s *Service) warnUnprotected() {
	if s.Config.Auth.Mode == "none" {
		s.log.Warn("AUTHENTICATION IS OFF (auth.mode: none): every request is the client \"anonymous\"; use this for local development only")
	}
	if s.Config.Admin.Listen == "" && s.Config.Admin.TokenSHA256 == nil {
		s.log.Warn("/metrics and /admin/* are served without credentials on the API listener; set admin.listen or admin.token_sha256 to protect them")
	}
}

// serveAPI starts the API server on ln, over TLS when configured.
func (s *Service) serveAPI(ln net.Listener, errc chan<- error) (*http.Server, error) {
	hs := httpServer(s.Config, s.Router, s.log)
	var err error
	if hs.TLSConfig, err = serverTLS(s.Config.TLS); err != nil {
		return nil, err
	}
	go func() {
		if s.Config.TLS.CertFile != "" {
			errc <- hs.ServeTLS(ln, s.Config.TLS.CertFile, s.Config.TLS.KeyFile)
			return
		}
		errc <- hs.Serve(ln)
	}()
	return hs, nil
}

// serveAdmin starts the admin listener when admin.listen is set; nil otherwise.
func (s *Service) serveAdmin(errc chan<- error) (*http.Server, error) {
	if s.Config.Admin.Listen == "" {
		return nil, nil
	}
	aln, err := net.Listen("tcp", s.Config.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen: %w", err)
	}
	admin := httpServer(s.Config, s.Router.AdminHandler(), s.log)
	go func() { errc <- admin.Serve(aln) }()
	s.log.Info("admin endpoints (/metrics, /admin/*) served separately", "addr", aln.Addr().String())
	return admin, nil
}

// shutdown stops accepting, lets in-flight requests finish (bounded), and closes the pools.
func (s *Service) shutdown(api, admin *http.Server) error {
	s.log.Info("shutting down: no new connections; finishing in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := api.Shutdown(sctx)
	if admin != nil {
		admin.Shutdown(sctx) //nolint:errcheck // the API server's result is the one that matters
	}
	if s.Relay != nil {
		s.Relay.Wait() // the credits of the last debits, bounded by the request timeout
	}
	s.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	s.log.Info("stopped")
	return nil
}

// reloadLoop reloads the shard map on each signal from hup (SIGHUP) and whenever the map file's
// content changes, one reload at a time, until ctx ends.
func (s *Service) reloadLoop(ctx context.Context, hup <-chan os.Signal) {
	reloadNow := make(chan struct{}, 1)
	trigger := func() {
		select {
		case reloadNow <- struct{}{}:
		default: // a reload is already pending
		}
	}
	poll := time.NewTicker(MapPollInterval)
	defer poll.Stop()
	go watchMap(ctx, s.Config.ShardmapPath, poll.C, trigger)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			trigger()
		case <-reloadNow:
			s.Router.Reload(s.Config.ShardmapPath) //nolint:errcheck // Reload logs and counts its result
		}
	}
}

// upkeepLoop runs partition upkeep on every shard hourly, and a minute after a failed pass.
func (s *Service) upkeepLoop(ctx context.Context) {
	for {
		t := s.Router.Topology() // one topology for both map and pools
		next := upkeepInterval
		if err := Upkeep(ctx, s.Config, t.Map, t.Pool, logWriter{s.log}, s.upkeep); err != nil {
			next = upkeepRetry // logged per shard; try again soon, not in an hour
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
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

// watchMap looks at the map file on every tick of looks, and calls changed whenever the content of the map file has changed since the last call
// and then stayed the same for one more look: a file written in place (an editor, `cat >`, a
// configuration tool) is never taken while it is still being written, even when a half-written
// map would be valid. Writing by rename is still the safe way: a reader never sees half a file.
// The first settled look always calls it: the map the router started with was read before this
// watch began, and the file may have changed in between (the reload that follows is a no-op
// when it did not). Comparing content rather than size and modification time also sees an edit
// that keeps the size within the file system's timestamp granularity; polling needs no extra
// dependency and also sees a file replaced by a rename (as Kubernetes ConfigMap updates do).
func watchMap(ctx context.Context, path string, looks <-chan time.Time, changed func()) {
	taken, seen := "", ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-looks:
			d := fileDigest(path)
			if d != seen { // new content, or still being written: look again before taking it
				seen = d
				continue
			}
			if d != taken && d != "" {
				taken = d
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
