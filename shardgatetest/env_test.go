package shardgatetest

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain keeps the examples, which cannot skip, from failing where no backend can run: they
// are left out, as New skips the tests.
func TestMain(m *testing.M) {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_, err := Available(ctx, "")
	cancel()
	if CanSkip(err) {
		fmt.Fprintf(os.Stderr, "SKIP the examples: %v\n", err)
		flag.Set("test.run", "^Test") //nolint:errcheck // the flag exists
	}
	os.Exit(m.Run())
}

// post sends a transfer with key and token to the Env's router and returns the status.
func post(t *testing.T, e *Env, token, key string, src int64) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL+"/transfers", strings.NewReader(fmt.Sprintf(`{"src":%d,"dst":%d,"amount":5}`, src, src+1)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
	resp.Body.Close()
	return resp.StatusCode
}

// Every fault of a Shard, on the owning shard of a transfer: while it lasts the transfer is a
// retryable 503, and once healed the same key applies.
func TestShardFaults(t *testing.T) {
	e := New(t, Options{RouterYAML: "shard_pool:\n  request_timeout: 1s\n  connect_timeout: 1s\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if len(e.Shards) != 2 || len(e.DSNs()) != 2 || e.Shards[1].Name() != "shard-1" || e.Map.Version != 1 {
		t.Fatalf("shards %v, map version %d", e.DSNs(), e.Map.Version)
	}
	if got := post(t, e, e.Token, "k-warm", 1); got != http.StatusCreated {
		t.Fatalf("first transfer: %d", got)
	}
	for _, f := range []struct {
		name   string
		inject func(Shard) error
		heal   func(Shard) error
	}{
		{"stop", func(s Shard) error { return s.Stop(ctx) }, func(s Shard) error { return s.Restart(ctx) }},
		{"kill", func(s Shard) error { return s.Kill(ctx) }, func(s Shard) error { return s.Restart(ctx) }},
		{"pause", func(s Shard) error { return s.Pause(ctx) }, func(s Shard) error { return s.Resume(ctx) }},
	} {
		key, src := "k-"+f.name, int64(len(f.name))
		shard := e.ShardOf(src)
		if err := f.inject(shard); err != nil {
			t.Fatalf("%s %s: %v", f.name, shard.Name(), err)
		}
		got := post(t, e, e.Token, key, src)
		if err := f.heal(shard); err != nil {
			t.Fatalf("healing %s %s: %v", f.name, shard.Name(), err)
		}
		if got != http.StatusServiceUnavailable {
			t.Errorf("%s: %d while %s is down, want 503", f.name, got, shard.Name())
		}
		waitCreated(t, e, key, src)
	}
	logs, err := e.RouterLogs(ctx)
	if err != nil || !strings.Contains(logs, "shard") {
		t.Errorf("router logs: %v, %q", err, logs)
	}
	for _, secret := range []string{e.Token, e.Shards[0].Password()} {
		if strings.Contains(logs, secret) {
			t.Error("the router's log holds a secret")
		}
	}
}

// waitCreated retries key until the router answers 201 (a fresh transfer or its replay). A 503
// or a 409 (an earlier attempt's statement, sent before a fault, may still be running on the
// shard once it is back) is retried, as a client would.
func waitCreated(t *testing.T, e *Env, key string, src int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := post(t, e, e.Token, key, src)
		if got == http.StatusCreated {
			return
		}
		if (got != http.StatusServiceUnavailable && got != http.StatusConflict) || time.Now().After(deadline) {
			t.Fatalf("retry of %s: %d, want 201", key, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Options reach the router: the ranges, every client's token, the retention.
func TestOptionsReachTheRouter(t *testing.T) {
	e := New(t, Options{
		Ranges:    [][]string{{"-40", "c0-"}, {"40-c0"}, {}},
		Clients:   map[string]string{"alpha": "token-alpha", "beta": "token-beta"},
		Retention: 48 * time.Hour,
	})
	if e.Token != "token-alpha" || len(e.Tokens) != 2 || e.Config.Idempotency.ReplayWindow != 24*time.Hour {
		t.Errorf("token %q, tokens %v, replay window %s", e.Token, e.Tokens, e.Config.Idempotency.ReplayWindow)
	}
	resp, err := http.Get(e.URL + "/admin/shardmap")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Shards []struct {
			Name   string   `json:"name"`
			Ranges []string `json:"ranges"`
		} `json:"shards"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(m.Shards); got != "[{shard-0 [-40 c0-]} {shard-1 [40-c0]} {shard-2 []}]" {
		t.Errorf("served map: %s", got)
	}
	for name, token := range e.Tokens {
		if got := post(t, e, token, "k-"+name, 8842); got != http.StatusCreated {
			t.Errorf("client %s: %d", name, got)
		}
	}
	if got := post(t, e, "not-a-token", "k-x", 8842); got != http.StatusUnauthorized {
		t.Errorf("unknown token: %d", got)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
