package integration

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
)

// The idempotency scope is client plus operation: one key string from two clients is two
// operations, and neither client can replay or learn of the other's response.
func TestSameKeyFromTwoClientsIsIndependent(t *testing.T) {
	key := newKey()
	asB := map[string]string{"Idempotency-Key": key, "Authorization": "Bearer token-b"}
	bodyA, bodyB := transferBody(11001, 1, 100), transferBody(11001, 1, 999)

	a := post(t, key, bodyA)
	b := do(t, http.MethodPost, "/transfers", asB, bodyB)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first use by each client: a %d %s, b %d %s; want two fresh 201s", a.status, a.body, b.status, b.body)
	}
	if a.header.Get("Location") == b.header.Get("Location") {
		t.Fatal("two clients' operations got the same transfer id")
	}
	if r := post(t, key, bodyA); string(r.body) != string(a.body) || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("client a's retry: %d %s, want its own replay", r.status, r.body)
	}
	if r := do(t, http.MethodPost, "/transfers", asB, bodyB); string(r.body) != string(b.body) || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("client b's retry: %d %s, want its own replay", r.status, r.body)
	}
	// b sending a's exact request with the key gets 422 for its own use of the key, never a's response.
	if r := do(t, http.MethodPost, "/transfers", asB, bodyA); r.status != http.StatusUnprocessableEntity || strings.Contains(string(r.body), "100") {
		t.Errorf("client b with client a's body: %d %s, want 422 without a's data", r.status, r.body)
	}
	var rows int
	if err := env.pools[shardOf(11001)].QueryRow(context.Background(),
		"SELECT count(*) FROM idempotency_record WHERE key = $1", key).Scan(&rows); err != nil || rows != 2 {
		t.Errorf("%d records for the key (%v), want one per client", rows, err)
	}
}

// A saturated shard is answered with a prompt 503 and Retry-After, not an unbounded queue; once
// the load is gone the shard serves again.
func TestSaturatedShardIs503AndRecovers(t *testing.T) {
	const src = 12001
	shard := shardOf(src)
	_, base := newRouter(t, env.mapPath, func(c *config.Config) {
		c.ShardPool.MaxConns = 1
		c.ShardPool.MaxWaiting = 0
	})
	release := holdLedger(t, shard)
	held := make(chan reply, 1)
	go func() {
		held <- doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(src, 1, 1))
	}()
	waitFor(t, func() bool { return lockWaiters(t, shard) > 0 })

	start := time.Now()
	r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(src, 1, 2))
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("saturated shard answered after %v; want a prompt refusal", elapsed)
	}
	if r.status != http.StatusServiceUnavailable || r.problemType() != "shard-busy" || r.header.Get("Retry-After") == "" {
		t.Errorf("saturated: %d %v %s, want 503 shard-busy with Retry-After", r.status, r.header, r.body)
	}
	release()
	if first := <-held; first.status != http.StatusCreated {
		t.Errorf("the request holding the shard: %d %s", first.status, first.body)
	}
	if r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(src, 1, 3)); r.status != http.StatusCreated {
		t.Errorf("after the load: %d %s, want 201", r.status, r.body)
	}
}

// Admin endpoints can require their own token, and never show a DSN's password.
func TestAdminEndpointsNeedTheirToken(t *testing.T) {
	sum := sha256.Sum256([]byte("admin-token"))
	_, base := newRouter(t, env.mapPath, func(c *config.Config) { c.Admin.TokenSHA256 = &sum })
	for _, path := range []string{"/admin/shardmap", "/admin/route?account=8842", "/metrics"} {
		if r := doAt(t, base, http.MethodGet, path, nil, ""); r.status != http.StatusUnauthorized {
			t.Errorf("%s with a client token: %d, want 401", path, r.status)
		}
		r := doAt(t, base, http.MethodGet, path, map[string]string{"Authorization": "Bearer admin-token"}, "")
		if r.status != http.StatusOK {
			t.Errorf("%s with the admin token: %d %s", path, r.status, r.body)
		}
		if strings.Contains(string(r.body), shardPassword) {
			t.Errorf("%s shows a shard password", path)
		}
	}
	r := doAt(t, base, http.MethodGet, "/admin/route?account=8842", map[string]string{"Authorization": "Bearer admin-token"}, "")
	if !strings.Contains(string(r.body), `"keyspace_id":"1d65d16c18855fc7"`) || !strings.Contains(string(r.body), `"range":"-80"`) {
		t.Errorf("route of 8842: %s", r.body)
	}
}
