// The client against the real router on two real PostgreSQL shards, started by shardgatetest
// (local processes where PostgreSQL is installed, containers with SHARDGATE_TEST_BACKEND=docker),
// with every response checked against api/openapi.yaml. Where neither backend can run these
// tests skip, unless CI is set.
package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/api"
	"github.com/shardgate/shardgate/client"
	"github.com/shardgate/shardgate/shardgatetest"
)

// shared is the router and shards every integration test uses; a stopped shard makes the
// router's 503 prompt (request_timeout) and its Retry-After short.
var shared = shardgatetest.NewShared(shardgatetest.Options{
	RouterYAML: "shard_pool:\n  connect_timeout: 1s\n  request_timeout: 2s\n  retry_after: 1s\n",
})

// pools are direct connections to the shards, for assertions, by shard name.
var pools = struct {
	sync.Mutex
	m map[string]*pgxpool.Pool
}{m: map[string]*pgxpool.Pool{}}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range pools.m {
		p.Close()
	}
	if err := shared.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "closing the shards and router:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// conformance is a transport that checks every response against api/openapi.yaml.
type conformance struct {
	v    *api.Validator
	mu   sync.Mutex
	errs []error
}

func (c *conformance) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err := c.v.ValidateResponse(req, resp.StatusCode, resp.Header, body); err != nil {
		c.mu.Lock()
		c.errs = append(c.errs, err)
		c.mu.Unlock()
	}
	return resp, nil
}

// newClient returns a client of the shared router whose every response must conform to the
// document by the end of the test, and the router's Env.
func newClient(t *testing.T, policy client.RetryPolicy) (*client.Client, *conformance, *shardgatetest.Env) {
	t.Helper()
	env := shared.Env(t)
	v, err := api.NewResponseValidator()
	if err != nil {
		t.Fatal(err)
	}
	conf := &conformance{v: v}
	c, err := client.New(env.URL, client.WithToken(env.Token), client.WithRetryPolicy(policy), client.WithHTTPClient(&http.Client{Transport: conf}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range conf.errs {
			t.Errorf("response does not conform: %v", err)
		}
	})
	return c, conf, env
}

// accountOn returns the first account after after that shard owns.
func accountOn(env *shardgatetest.Env, shard string, after int64) int64 {
	for a := after + 1; ; a++ {
		if env.ShardOf(a).Name() == shard {
			return a
		}
	}
}

// debits counts the transfer_out rows of transfer id on the shard that owns src.
func debits(t *testing.T, env *shardgatetest.Env, src int64, id string) int {
	t.Helper()
	shard := env.ShardOf(src)
	pools.Lock()
	p := pools.m[shard.Name()]
	if p == nil {
		var err error
		if p, err = pgxpool.New(context.Background(), shard.DSN()); err != nil {
			pools.Unlock()
			t.Fatal(err)
		}
		pools.m[shard.Name()] = p
	}
	pools.Unlock()
	var n int
	if err := p.QueryRow(context.Background(),
		"SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestIntegrationSendReplayAndRead(t *testing.T) {
	c, _, env := newClient(t, client.DefaultRetryPolicy())
	ctx := context.Background()
	op := client.NewTransfer(8842, 1190, 2500, "EUR")
	op.Reference = "integration"
	first, err := c.Send(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Send(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || !again.Replayed || again.Transfer.ID != first.Transfer.ID || again.Location != "/transfers/"+first.Transfer.ID {
		t.Errorf("first %+v, again %+v", first, again)
	}
	rec, err := c.GetTransfer(ctx, first.Transfer.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Src != 8842 || rec.Dst != 1190 || rec.Amount != 2500 || rec.Reference != "integration" || rec.CreatedAt.IsZero() {
		t.Errorf("GET: %+v", rec)
	}
	if n := debits(t, env, op.Src, first.Transfer.ID); n != 1 {
		t.Errorf("%d debits", n)
	}
	_, err = c.GetTransfer(ctx, "00000000000000000000000000000000000000000000beef")
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Slug() != "transfer-not-found" {
		t.Errorf("unknown id: %v", err)
	}
}

func TestIntegrationKeyReusedAndExpired(t *testing.T) {
	c, _, _ := newClient(t, client.DefaultRetryPolicy())
	ctx := context.Background()
	op := client.NewTransfer(11, 12, 100, "EUR")
	if _, err := c.Send(ctx, op); err != nil {
		t.Fatal(err)
	}
	op.Amount = 101
	if _, err := c.Send(ctx, op); !errors.Is(err, client.ErrKeyReused) {
		t.Errorf("same key, other amount: %v", err)
	}
	// A UUIDv7 minted 40 days ago, past the default retention of 720h.
	fresh := client.NewKey()
	ts := fmt.Sprintf("%012x", time.Now().Add(-40*24*time.Hour).UnixMilli())
	old := client.Transfer{Key: ts[:8] + "-" + ts[8:12] + fresh[13:], Src: 11, Dst: 12, Amount: 100, Currency: "EUR"}
	if _, err := c.Send(ctx, old); !errors.Is(err, client.ErrKeyExpired) {
		t.Errorf("old key: %v", err)
	}
}

// TestIntegrationConcurrentSends is the guide's verification through the client: the same
// operation sent twenty times at once is applied once; every caller gets its receipt.
func TestIntegrationConcurrentSends(t *testing.T) {
	p := client.DefaultRetryPolicy()
	p.BudgetBurst = 100 // this test is about the server, not the budget
	c, _, env := newClient(t, p)
	op := client.NewTransfer(8842, 1190, 2500, "EUR")
	receipts := make(chan *client.Receipt, 20)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			rc, err := c.Send(context.Background(), op)
			if err != nil {
				t.Error(err)
				return
			}
			receipts <- rc
		})
	}
	wg.Wait()
	close(receipts)
	applied := 0
	for rc := range receipts {
		if !rc.Replayed {
			applied++
		}
		if n := debits(t, env, op.Src, rc.Transfer.ID); n != 1 {
			t.Fatalf("%d debits for %s", n, rc.Transfer.ID)
		}
	}
	if applied != 1 {
		t.Errorf("%d answers were not replays; want exactly 1", applied)
	}
}

// TestIntegrationShardOutage stops the owning shard: the send ends with an unknown outcome and
// the key kept; after the shard is back, the same operation applies exactly once.
func TestIntegrationShardOutage(t *testing.T) {
	// Two attempts and no deadline: the send ends on the second 503, whatever the machine's
	// speed (a deadline could instead end it in the middle of an attempt).
	policy := client.DefaultRetryPolicy()
	policy.MaxAttempts = 2
	c, _, env := newClient(t, policy)
	shard := env.Shards[0]
	src := accountOn(env, shard.Name(), 0)
	op := client.NewTransfer(src, src+1, 700, "EUR")
	ctx := context.Background()
	if err := shard.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			shard.Restart(ctx) //nolint:errcheck // the next tests would fail and say so
		}
	}()
	if r, err := c.Readyz(ctx, false); err != nil || r.Ready || r.Shards[shard.Name()] != "unreachable" {
		t.Errorf("readyz with %s down: %+v, %v", shard.Name(), r, err)
	}
	if r, err := c.Readyz(ctx, true); err != nil || !r.Ready {
		t.Errorf("readyz?partial=1 with %s down: %+v, %v", shard.Name(), r, err)
	}
	_, err := c.Send(ctx, op)
	var unknown *client.UnknownOutcomeError
	var prob *client.Problem
	if !errors.As(err, &unknown) || unknown.Key != op.Key || !errors.Is(err, client.ErrAttemptsExhausted) ||
		!errors.As(err, &prob) || prob.Status != http.StatusServiceUnavailable {
		t.Fatalf("send with the shard down: %v", err)
	}
	if err := shard.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	again, _, _ := newClient(t, client.DefaultRetryPolicy()) // the usual retries while the pool reconnects
	rc, err := again.Send(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	if n := debits(t, env, src, rc.Transfer.ID); n != 1 {
		t.Errorf("%d debits after the outage", n)
	}
}

// eur returns account's EUR position.
func eur(t *testing.T, c *client.Client, account int64) client.CurrencyBalance {
	t.Helper()
	b, err := c.Balance(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	if b.Account != account {
		t.Fatalf("asked for the balance of %d, got %d's", account, b.Account)
	}
	cb, _ := b.In("EUR")
	return cb
}

// awaitSettled reads transfer id until its credit is settled, and returns it then.
func awaitSettled(t *testing.T, c *client.Client, id string, within time.Duration) *client.TransferRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		rec, err := c.GetTransfer(ctx, id)
		switch {
		case err != nil:
			t.Fatalf("reading %s while waiting for its credit: %v", id, err)
		case rec.Credit == nil:
			t.Fatalf("GET /transfers/%s has no credit", id)
		case rec.Credit.State == client.CreditSettled:
			return rec
		case rec.Credit.State != client.CreditPending:
			t.Fatalf("credit in state %q", rec.Credit.State)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the credit of %s is still pending after %s: is the relay running?", id, within)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestIntegrationBalanceAndCredit follows a transfer between accounts of the two shards: the
// debit is in src's balance at once, its credit pending until the relay (running in the
// router) delivers it, then settled and in dst's balance. A transfer within one shard is
// settled at once. Accounts above 10⁶ are this test's own, so the deltas are exact.
func TestIntegrationBalanceAndCredit(t *testing.T) {
	c, _, env := newClient(t, client.DefaultRetryPolicy())
	ctx := context.Background()
	src := accountOn(env, env.Shards[0].Name(), 1_000_000)
	dst := accountOn(env, env.Shards[1].Name(), 1_000_000)
	srcBefore, dstBefore := eur(t, c, src), eur(t, c, dst)

	rc, err := c.Send(ctx, client.NewTransfer(src, dst, 700, "EUR"))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Transfer.Credit != nil {
		t.Errorf("the 201 of POST /transfers carries a credit: %+v", rc.Transfer.Credit)
	}
	mid := eur(t, c, src)
	if mid.Debits != srcBefore.Debits+700 || mid.Balance != srcBefore.Balance-700 ||
		mid.PendingOut != srcBefore.PendingOut && mid.PendingOut != srcBefore.PendingOut+700 {
		t.Errorf("src after the debit: %+v, before %+v", mid, srcBefore)
	}
	rec, err := c.GetTransfer(ctx, rc.Transfer.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Credit == nil || rec.Credit.State != client.CreditPending && rec.Credit.State != client.CreditSettled {
		t.Fatalf("credit right after the debit: %+v", rec.Credit)
	}
	rec = awaitSettled(t, c, rc.Transfer.ID, 30*time.Second)
	if rec.Credit.SettledAt.Before(rec.CreatedAt) {
		t.Errorf("credit settled at %s, before its debit at %s", rec.Credit.SettledAt, rec.CreatedAt)
	}
	wantSrc := client.CurrencyBalance{Currency: "EUR", Balance: srcBefore.Balance - 700, Credits: srcBefore.Credits,
		Debits: srcBefore.Debits + 700, PendingOut: srcBefore.PendingOut}
	wantDst := client.CurrencyBalance{Currency: "EUR", Balance: dstBefore.Balance + 700, Credits: dstBefore.Credits + 700,
		Debits: dstBefore.Debits, PendingOut: dstBefore.PendingOut}
	if got := eur(t, c, src); got != wantSrc {
		t.Errorf("src once settled: %+v, want %+v", got, wantSrc)
	}
	if got := eur(t, c, dst); got != wantDst {
		t.Errorf("dst once settled: %+v, want %+v", got, wantDst)
	}

	near := accountOn(env, env.Shards[0].Name(), src)
	nearBefore := eur(t, c, near)
	rc, err = c.Send(ctx, client.NewTransfer(src, near, 100, "EUR"))
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = c.GetTransfer(ctx, rc.Transfer.ID); err != nil || rec.Credit == nil || rec.Credit.State != client.CreditSettled || rec.Credit.SettledAt.IsZero() {
		t.Errorf("a transfer within one shard: %+v, %v; want its credit settled at once", rec, err)
	}
	if got := eur(t, c, near); got.Credits != nearBefore.Credits+100 || got.Balance != nearBefore.Balance+100 {
		t.Errorf("same-shard dst: %+v, before %+v", got, nearBefore)
	}

	b, err := c.Balance(ctx, math.MinInt64)
	if err != nil || b.Account != math.MinInt64 || b.Balances == nil || len(b.Balances) != 0 {
		t.Errorf("an account without ledger rows: %+v, %v; want no balances", b, err)
	}
}

func TestIntegrationProbes(t *testing.T) {
	c, _, _ := newClient(t, client.DefaultRetryPolicy())
	if err := c.Healthz(context.Background()); err != nil {
		t.Error(err)
	}
	if r, err := c.Readyz(context.Background(), false); err != nil || !r.Ready || len(r.Shards) != 2 {
		t.Errorf("readyz: %+v, %v", r, err)
	}
}

// TestIntegrationDocumentMatchesRouter sends the router requests the client never sends —
// refusals, admin endpoints — and checks every answer against api/openapi.yaml.
func TestIntegrationDocumentMatchesRouter(t *testing.T) {
	_, conf, env := newClient(t, client.DefaultRetryPolicy())
	hc := &http.Client{Transport: conf}
	key := func() string { return client.NewKey() }
	for _, r := range []struct {
		method, path, key, contentType, body string
		auth                                 bool
		status                               int
	}{
		{"POST", "/transfers", key(), "application/json", `{"src":1,"dst":2,"amount":5}`, false, 401},
		{"POST", "/transfers", "", "application/json", `{"src":1,"dst":2,"amount":5}`, true, 400},
		{"POST", "/transfers", "has space", "application/json", `{"src":1,"dst":2,"amount":5}`, true, 400},
		{"POST", "/transfers", key(), "text/plain", `{"src":1,"dst":2,"amount":5}`, true, 415},
		{"POST", "/transfers", key(), "application/json; charset=latin1", `{"src":1,"dst":2,"amount":5}`, true, 415},
		{"POST", "/transfers", key(), "application/json", `{"src":1,"dst":1,"amount":5}`, true, 400},
		{"POST", "/transfers", key(), "application/json", `{"src":1,"dst":2,"amount":5,"pad":"` + string(bytes.Repeat([]byte("x"), 20000)) + `"}`, true, 413},
		{"GET", "/transfers/not-an-id", "", "", "", true, 400},
		{"GET", "/transfers/0000000000000000000000000000000000000000000000ff", "", "", "", false, 401},
		{"GET", "/readyz?partial=1", "", "", "", false, 200},
		{"GET", "/metrics", "", "", "", false, 200},
		{"GET", "/admin/shardmap", "", "", "", false, 200},
		{"GET", "/admin/route?account=8842", "", "", "", false, 200},
		{"GET", "/admin/route?account=x", "", "", "", false, 400},
		{"GET", "/accounts/x/balance", "", "", "", true, 400},
		{"GET", "/accounts/99999999999999999999/balance", "", "", "", true, 400},
		{"GET", "/accounts/8842/balance", "", "", "", false, 401},
	} {
		req, err := http.NewRequest(r.method, env.URL+r.path, bytes.NewReader([]byte(r.body)))
		if err != nil {
			t.Fatal(err)
		}
		if r.key != "" {
			req.Header.Set("Idempotency-Key", r.key)
		}
		if r.contentType != "" {
			req.Header.Set("Content-Type", r.contentType)
		}
		if r.auth {
			req.Header.Set("Authorization", "Bearer "+env.Token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != r.status {
			t.Errorf("%s %s: %d, want %d", r.method, r.path, resp.StatusCode, r.status)
		}
	}
}
