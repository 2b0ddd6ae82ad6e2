package shardgatetest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/shardgate/shardgate/internal/service"
)

// serveLocal runs the router in this process, as `router serve` would run it, from router.yaml
// and shardmap.yaml in a temp dir, on a loopback port.
func (e *Env) serveLocal(ctx context.Context, o Options) error {
	dir, err := os.MkdirTemp("", "shardgatetest-")
	if err != nil {
		return err
	}
	e.closers = append(e.closers, func() error { return os.RemoveAll(dir) })
	cfgPath := filepath.Join(dir, "router.yaml")
	yml, err := e.prepare(ctx, o, cfgPath, "127.0.0.1:0")
	if err != nil {
		return err
	}
	// The files are what the router reads again on a reload, as in production.
	if err := os.WriteFile(cfgPath, yml, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(e.Config.ShardmapPath, shardmapYAML(e.DSNs(), o.Ranges), 0o600); err != nil {
		return err
	}
	e.logs = &tailBuffer{max: maxLogBytes}
	svc, err := service.New(e.Config, e.Map, slog.New(slog.NewTextHandler(e.logs, nil)))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx, ln, nil) }()
	e.URL = "http://" + ln.Addr().String()
	e.closers = append(e.closers, func() error {
		stop()
		return <-done // Run finishes in-flight requests and closes the pools
	})
	return waitReady(ctx, e.URL, done)
}

// readyPoll is how often waitReady asks.
const readyPoll = 50 * time.Millisecond

// waitReady polls GET url/readyz until it answers 200, ctx ends, or done (the in-process
// router's end, if any) delivers an error.
func waitReady(ctx context.Context, url string, done <-chan error) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		last = err
		select {
		case err := <-done:
			return fmt.Errorf("shardgatetest: the router stopped while starting: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("shardgatetest: the router at %s is not ready (%w): %w", url, last, context.Cause(ctx))
		case <-time.After(readyPoll):
		}
	}
}

// maxLogBytes bounds the in-process router's log an Env keeps.
const maxLogBytes = 1 << 20

// tailBuffer keeps the last max bytes written to it, at line boundaries. It is safe for
// concurrent use.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2*b.max { // trimmed in bulk, so that writing stays amortized O(len(p))
		cut := len(b.buf) - b.max
		if i := bytes.IndexByte(b.buf[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		b.buf = append(b.buf[:0], b.buf[cut:]...)
	}
	return len(p), nil
}

// String returns what the buffer holds.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
