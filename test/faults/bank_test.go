package faults

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardgatetest"
	"github.com/shardgate/shardgate/shardmap"
)

// Sizes of the bank run. The whole test stays well under three minutes on a 2-core machine.
const (
	numShards   = 3
	numClients  = 6
	maxAttempts = 6                       // per key: the first try and its retries
	dropRate    = 0.08                    // share of responses the proxy swallows after COMMIT
	clientWait  = 6 * time.Second         // client-side deadline per request
	settle      = 1500 * time.Millisecond // calm between faults
)

// bankPool is the router's shard pool: the request timeout is short so a paused or cut-off
// shard turns into 503s quickly instead of holding clients for the default.
const bankPool = `shard_pool:
  max_conns: 8
  connect_timeout: 1s
  request_timeout: 3s
  retry_after: 1s
`

const bankToken = "bank-token"

// attempt is one request of a client and what came of it.
type attempt struct {
	status   int    // 0 when no response was received
	replayed bool   // Idempotent-Replayed: true
	body     []byte // response body
	err      string // transport error or timeout, when status is 0
}

// op is one idempotency key's history: the request and every attempt made with it.
type op struct {
	key              string
	src, dst, amount int64
	body             string
	invalid          bool // deliberately invalid request: must fail with 400 and store nothing
	attempts         []attempt
}

// outcome classifies an op from its history alone, as a client would.
type outcome int

const (
	acked        outcome = iota // some attempt got 201
	surelyFailed                // only 4xx other than 409: the server said no and nothing else
	unknown                     // no 201, and some 503, 409, timeout or reset: it may have landed
)

func (o *op) outcome() outcome {
	definite := true
	for _, a := range o.attempts {
		switch {
		case a.status == http.StatusCreated:
			return acked
		case a.status >= 400 && a.status < 500 && a.status != http.StatusConflict:
		default:
			definite = false
		}
	}
	if definite && len(o.attempts) > 0 {
		return surelyFailed
	}
	return unknown
}

// TestBankUnderFaults is a Jepsen-style bank check: clients move money with retries while shards
// are paused, killed, cut off the network, the router restarts, and a proxy drops responses after
// the shard committed. Afterwards the ledger must agree with what clients were told.
func TestBankUnderFaults(t *testing.T) {
	if os.Getenv(shardgatetest.BackendEnv) != string(shardgatetest.Docker) {
		t.Skip("set SHARDGATE_TEST_BACKEND=docker to run the fault suite against shard containers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Shards and the router image as containers on one network. A fault suite that cannot start
	// tests nothing: New fails in CI, and skips elsewhere only if no backend can run.
	env := shardgatetest.New(t, shardgatetest.Options{
		Backend:    shardgatetest.Docker,
		Shards:     numShards,
		Clients:    map[string]string{"bank": bankToken},
		RouterYAML: bankPool,
	})
	rt := env.RouterContainer()
	px := newDropProxy(t, rt.Addr(), dropRate)
	defer px.Close()
	httpc := &http.Client{
		Timeout: clientWait,
		// A fresh connection per request, so the proxy's drop decision is per request.
		Transport: &http.Transport{DisableKeepAlives: true},
	}

	// Clients run until the fault schedule is over.
	ops := runClients(ctx, httpc, px.URL(), func() { injectFaults(ctx, t, env) })
	pools := assertionPools(ctx, t, env)
	counts := check(ctx, t, ops, pools)
	t.Logf("history: %d keys, %d requests, %d responses dropped by the proxy", len(ops), counts.requests, px.dropped.Load())
	t.Logf("acknowledged %d (1 row each), surely failed %d (0 rows), unknown %d (%d landed, %d did not), replays checked %d",
		counts.acked, counts.failed, counts.unknown, counts.unknownLanded, counts.unknown-counts.unknownLanded, counts.replays)
	t.Logf("ledger sum %d = acknowledged %d + unknown that landed %d", counts.ledgerSum, counts.ackedSum, counts.unknownSum)

	px.setDropRate(0)
	resolved, refused := resolveUnknown(ctx, t, httpc, px.URL(), ops)
	final := check(ctx, t, ops, pools)
	if final.unknown != 0 || final.acked != counts.acked+resolved || final.failed != counts.failed+refused {
		t.Errorf("after healing: %d acknowledged, %d failed, %d unknown; want %d, %d and 0",
			final.acked, final.failed, final.unknown, counts.acked+resolved, counts.failed+refused)
	}
	t.Logf("after healing: %d unknown keys retried: %d applied or replayed once, %d refused; ledger sum %d", resolved+refused, resolved, refused, final.ledgerSum)
	checkRouterLogs(ctx, t, env)
	fmt.Printf("bank summary: keys=%d requests=%d dropped=%d acked=%d failed=%d unknown=%d landed=%d replays=%d ledger_sum=%d healed=%d ok=%t\n",
		len(ops), counts.requests, px.dropped.Load(), counts.acked, counts.failed, counts.unknown, counts.unknownLanded,
		counts.replays, counts.ledgerSum, resolved+refused, !t.Failed())
}

// runClients runs numClients clients sending transfers with retries through url while during
// runs, and returns every client's history once during has returned and the clients stopped.
func runClients(ctx context.Context, httpc *http.Client, url string, during func()) []*op {
	var (
		mu   sync.Mutex
		ops  []*op
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for c := range numClients {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for n := 0; !stop.Load(); n++ {
				o := newOp(rng, c, n)
				runOp(ctx, httpc, url, o, rng)
				mu.Lock()
				ops = append(ops, o)
				mu.Unlock()
			}
		})
	}
	func() {
		defer func() { // also when during ends the test with t.Fatal
			stop.Store(true)
			wg.Wait()
		}()
		during()
	}()
	return ops
}

// injectFaults runs the fault schedule: each fault is injected, held, and healed, with calm
// between them. The router image runs as a container on the shards' network, as users deploy
// it; its fault SIGKILLs it mid-traffic and starts it again.
func injectFaults(ctx context.Context, t *testing.T, env *shardgatetest.Env) {
	t.Helper()
	shards, rt := env.Cluster().Shards, env.RouterContainer()
	faults := []struct {
		name         string
		inject, heal func(context.Context) error
		hold         time.Duration
	}{
		{"pause shard-0", shards[0].Pause, shards[0].Resume, 4 * time.Second},
		{"kill shard-1", shards[1].Kill, shards[1].Restart, 2 * time.Second},
		{"cut shard-2 off the network", shards[2].Disconnect, shards[2].Connect, 4 * time.Second},
		{"kill the router (SIGKILL) and start it again", rt.Kill, rt.Restart, time.Second},
	}
	time.Sleep(settle)
	for _, f := range faults {
		t.Logf("fault: %s", f.name)
		if err := f.inject(ctx); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		time.Sleep(f.hold)
		if err := f.heal(ctx); err != nil {
			t.Fatalf("healing %s: %v", f.name, err)
		}
		time.Sleep(settle)
	}
}

// resolveUnknown retries, once everything is healed, every key whose outcome is unknown: each
// must now get a definite answer — a valid transfer applies or replays exactly once, an invalid
// one is refused. It returns how many applied and how many were refused.
func resolveUnknown(ctx context.Context, t *testing.T, httpc *http.Client, url string, ops []*op) (resolved, refused int) {
	t.Helper()
	for _, o := range ops {
		if o.outcome() != unknown {
			continue
		}
		o.attempts = nil
		runOp(ctx, httpc, url, o, mrand.New(mrand.NewPCG(1, 2)))
		switch got := o.outcome(); {
		case got == acked && !o.invalid:
			resolved++
		case got == surelyFailed && o.invalid:
			refused++
		default:
			t.Errorf("key %s: no definite answer after healing: %+v", o.key, o.attempts)
		}
	}
	return resolved, refused
}

// newOp makes client c's n-th operation: mostly valid transfers between a few hot accounts (so
// keys of different clients meet on the same rows), sometimes an invalid one.
func newOp(rng *mrand.Rand, c, n int) *op {
	o := &op{key: fmt.Sprintf("bank-%d-%d-%d", c, n, rng.Uint32()), src: 1 + rng.Int64N(40), amount: 1 + rng.Int64N(1000)}
	o.dst = 1 + (o.src+rng.Int64N(39))%40
	o.body = fmt.Sprintf(`{"src": %d, "dst": %d, "amount": %d}`, o.src, o.dst, o.amount)
	if rng.IntN(10) == 0 {
		o.invalid = true
		o.body = fmt.Sprintf(`{"src": %d, "dst": %d, "amount": 0}`, o.src, o.dst)
	}
	return o
}

// runOp sends o until it gets a definite answer (a 201 or a 4xx other than 409) or runs out of
// attempts. After a 201 it sometimes sends once more, to collect a replay to compare.
func runOp(ctx context.Context, httpc *http.Client, url string, o *op, rng *mrand.Rand) {
	for range maxAttempts {
		a := send(ctx, httpc, url, o)
		o.attempts = append(o.attempts, a)
		if a.status == http.StatusCreated {
			if rng.IntN(3) == 0 {
				o.attempts = append(o.attempts, send(ctx, httpc, url, o))
			}
			return
		}
		if a.status >= 400 && a.status < 500 && a.status != http.StatusConflict {
			return
		}
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
	}
}

func send(ctx context.Context, httpc *http.Client, url string, o *op) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/transfers", bytes.NewReader([]byte(o.body)))
	if err != nil {
		return attempt{err: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+bankToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", o.key)
	resp, err := httpc.Do(req)
	if err != nil {
		return attempt{err: err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return attempt{err: err.Error()}
	}
	return attempt{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: body}
}

// counts are the checker's findings.
type counts struct {
	requests, acked, failed, unknown, unknownLanded, replays int
	ledgerSum, ackedSum, unknownSum                          int64
}

// row is one transfer_out row of the ledger.
type row struct {
	amount int64
	shard  string
}

// check compares the clients' histories with the ledger of every shard.
func check(ctx context.Context, t *testing.T, ops []*op, pools map[string]*pgxpool.Pool) counts {
	t.Helper()
	rows := debitRows(ctx, t, pools)
	var c counts
	for _, got := range rows {
		for _, r := range got {
			c.ledgerSum += r.amount
		}
	}
	known := map[string]bool{}
	for _, o := range ops {
		id := router.TransferID(shardmap.KeyspaceID(o.src), "bank:transfer", o.key)
		known[id] = true
		c.add(t, o, rows[id])
	}
	for id := range rows {
		if !known[id] {
			t.Errorf("ledger row for transfer %s that no client sent", id)
		}
	}
	if c.ledgerSum != c.ackedSum+c.unknownSum {
		t.Errorf("ledger sum %d != acknowledged %d + landed unknown %d", c.ledgerSum, c.ackedSum, c.unknownSum)
	}
	if c.acked == 0 {
		t.Error("no transfer was acknowledged: the run proves nothing")
	}
	return c
}

// debitRows reads every shard's transfer_out rows by transfer id.
func debitRows(ctx context.Context, t *testing.T, pools map[string]*pgxpool.Pool) map[string][]row {
	t.Helper()
	rows := map[string][]row{}
	for name, p := range pools {
		r, err := p.Query(ctx, "SELECT transfer_id, amount FROM ledger_entries WHERE kind = 'transfer_out'")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for r.Next() {
			var id string
			var amount int64
			if err := r.Scan(&id, &amount); err != nil {
				t.Fatal(err)
			}
			rows[id] = append(rows[id], row{amount, name})
		}
		if err := r.Err(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return rows
}

// add checks one key's history against its ledger rows (got) and counts it.
func (c *counts) add(t *testing.T, o *op, got []row) {
	t.Helper()
	c.requests += len(o.attempts)
	for _, r := range got {
		if r.amount != o.amount {
			t.Errorf("key %s: ledger amount %d on %s, requested %d", o.key, r.amount, r.shard, o.amount)
		}
	}
	switch o.outcome() {
	case acked:
		c.acked++
		c.ackedSum += o.amount
		if o.invalid {
			t.Errorf("key %s: an invalid request was acknowledged", o.key)
		}
		if len(got) != 1 {
			t.Errorf("key %s: acknowledged, %d ledger rows, want exactly 1", o.key, len(got))
		}
		c.replays += checkReplays(t, o)
	case surelyFailed:
		c.failed++
		if len(got) != 0 {
			t.Errorf("key %s: surely failed (%d), yet %d ledger rows", o.key, o.attempts[0].status, len(got))
		}
	case unknown:
		c.unknown++
		if len(got) > 1 {
			t.Errorf("key %s: unknown outcome, %d ledger rows, want at most 1", o.key, len(got))
		}
		if len(got) == 1 {
			c.unknownLanded++
			c.unknownSum += o.amount
		}
	}
}

// checkReplays checks that every 201 after an acknowledged key's first is a byte-identical
// replay, and returns how many there were.
func checkReplays(t *testing.T, o *op) int {
	t.Helper()
	var first []byte
	n := 0
	for _, a := range o.attempts {
		if a.status != http.StatusCreated {
			continue
		}
		if first == nil {
			first = a.body
			continue
		}
		n++
		if !a.replayed || !bytes.Equal(a.body, first) {
			t.Errorf("key %s: later 201 (replayed=%t) %q differs from the first %q", o.key, a.replayed, a.body, first)
		}
	}
	return n
}

// assertionPools opens a pool per shard for the checker, closed with the test.
func assertionPools(ctx context.Context, t *testing.T, env *shardgatetest.Env) map[string]*pgxpool.Pool {
	t.Helper()
	pools := map[string]*pgxpool.Pool{}
	for _, s := range env.Shards {
		p, err := pgxpool.New(ctx, s.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[s.Name()] = p
	}
	return pools
}

// checkRouterLogs fails the test if the router's log holds a shard password or the client
// token; New shows the log's end when the test failed.
func checkRouterLogs(ctx context.Context, t *testing.T, env *shardgatetest.Env) {
	t.Helper()
	logs, err := env.RouterLogs(ctx)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	// Two starts and no clean stop: the log is the container's whole history, and the kill
	// really killed (a graceful shutdown would have logged "stopped").
	if n := strings.Count(logs, `msg=serving`); n != 2 || strings.Contains(logs, `msg=stopped`) {
		t.Errorf("the router's log shows %d starts and stopped=%t; want 2 starts and no clean stop", n, strings.Contains(logs, `msg=stopped`))
	}
	secrets := []string{bankToken}
	for _, s := range env.Shards {
		secrets = append(secrets, s.Password())
	}
	for _, sec := range secrets {
		if strings.Contains(logs, sec) {
			t.Errorf("the router's log contains a secret")
		}
	}
}

// dropProxy forwards TCP connections to the router. For a share of connections it forwards the
// request but swallows the response and resets the client's connection as soon as the router
// starts answering: the transfer committed, and the client never hears so.
type dropProxy struct {
	ln       net.Listener
	upstream string
	rate     atomic.Uint64 // float64 bits
	dropped  atomic.Int64
	wg       sync.WaitGroup
}

func newDropProxy(t *testing.T, upstream string, rate float64) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, upstream: upstream}
	p.setDropRate(rate)
	p.wg.Go(p.accept)
	return p
}

func (p *dropProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *dropProxy) setDropRate(r float64) { p.rate.Store(math.Float64bits(r)) }

func (p *dropProxy) Close() {
	p.ln.Close()
	p.wg.Wait()
}

func (p *dropProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		drop := mrand.Float64() < math.Float64frombits(p.rate.Load())
		p.wg.Go(func() { p.relay(client.(*net.TCPConn), drop) })
	}
}

func (p *dropProxy) relay(client *net.TCPConn, drop bool) {
	defer client.Close()
	up, err := net.DialTimeout("tcp", p.upstream, time.Second)
	if err != nil {
		client.SetLinger(0) // the router is down: the client sees a reset, as with no proxy
		return
	}
	defer up.Close()
	go func() {
		io.Copy(up, client) //nolint:errcheck // ends when either side closes
		up.(*net.TCPConn).CloseWrite()
	}()
	if !drop {
		io.Copy(client, up) //nolint:errcheck // ends when either side closes
		return
	}
	// Wait for the first byte of the answer: by then the shard transaction has committed.
	var b [1]byte
	if _, err := up.Read(b[:]); err == nil {
		p.dropped.Add(1)
	}
	client.SetLinger(0) // close with RST: the client gets "connection reset", not a clean EOF
}
