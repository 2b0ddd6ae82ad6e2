package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/shardmap"
)

// The two legs of transfers between accounts of both shards. The suite's router delivers the
// credits of its own debits at once: once its handoffs are done, each of its cross-shard
// transfers is settled with no relay pass, as its same-shard ones are from the start. A router
// whose relay is off (as one of an earlier release) leaves its cross-shard credits owed: they
// read pending, and their source shows them as pending_out, until a relay pass delivers them,
// settled at the time they were written on dst's shard. Each account's balance is exactly what
// its transfers imply at every step, a retried transfer credits nothing more, and reconcile
// finds the ledgers clean.
func TestCreditLegsSettleAndBalancesAddUp(t *testing.T) {
	settleAll(t) // what earlier tests left owed, so that the pass below settles only these
	base := 1<<40 + mrand.Int64N(1<<40)
	a0 := accountOn("shard-0", base)
	a1 := accountOn("shard-0", a0+1)
	b0 := accountOn("shard-1", base)
	b1 := accountOn("shard-1", b0+1)
	moves := []move{
		{src: a0, dst: b0, amount: 500, currency: "EUR"}, // cross-shard
		{src: b0, dst: a1, amount: 120, currency: "EUR"},
		{src: b1, dst: a0, amount: 300, currency: "USD"},
		{src: a0, dst: b1, amount: 50, currency: "USD"},
		{src: a0, dst: a1, amount: 70, currency: "EUR"}, // same shard
		{src: b0, dst: b1, amount: 30, currency: "EUR"},
		{src: a1, dst: a0, amount: 45, currency: "USD"},
		{src: b1, dst: a1, amount: 25, currency: "EUR", owed: true}, // through the router without a relay
		{src: a1, dst: b0, amount: 15, currency: "USD", owed: true},
		{src: b0, dst: b1, amount: 5, currency: "USD", owed: true},
	}
	accounts := []int64{a0, a1, b0, b1}
	_, noRelay := newRouter(t, env.mapPath, func(c *config.Config) { c.Relay.Enabled = false })
	owed := 0
	for i := range moves {
		m := &moves[i]
		m.key = newKey()
		base := env.url
		if m.owed {
			base = noRelay
			if m.crossShard() {
				owed++
			}
		}
		m.id = applyMoveAt(t, base, *m)
	}
	env.svc.Relay.Wait()

	// Before a pass: only the credits of the router without a relay are pending.
	for _, m := range moves {
		v := getTransfer(t, m.id)
		if m.owed && m.crossShard() {
			if v.Credit.State != "pending" || v.Credit.SettledAt != "" {
				t.Errorf("cross-shard %d -> %d of the router without a relay, before a pass: credit %+v, want pending without settled_at", m.src, m.dst, v.Credit)
			}
			continue
		}
		checkSettled(t, m, v)
	}
	checkBalances(t, accounts, moves, false)

	if n := env.svc.Relay.Pass(context.Background()); n != owed {
		t.Errorf("the relay pass settled %d credits, want the %d owed by the router without a relay", n, owed)
	}
	if n := owedCredits(t); n != 0 {
		t.Errorf("%d credits still owed after the pass", n)
	}
	for _, m := range moves {
		checkSettled(t, m, getTransfer(t, m.id))
		if n := creditRows(t, m.id); n != 1 {
			t.Errorf("transfer %s: %d credits on the shards, want 1", m.id, n)
		}
	}
	checkBalances(t, accounts, moves, true)

	// A retry of a settled transfer replays; nothing becomes owed and no second credit appears.
	m := moves[0]
	if r := post(t, m.key, moveBody(m)); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a settled transfer: %d %s, want the replay", r.status, r.body)
	}
	if n := env.svc.Relay.Pass(context.Background()); n != 0 {
		t.Errorf("after a replay the relay settled %d credits, want 0", n)
	}
	if n := creditRows(t, m.id); n != 1 {
		t.Errorf("after a replay: %d credits of %s, want 1", n, m.id)
	}
	checkBalances(t, accounts, moves, true)

	m0, _ := currentMap(t)
	if rep := reconcileRun(t, m0); !rep.Clean() {
		t.Errorf("reconcile after the relay pass is not clean:\n%s", printed(rep))
	}
}

// `router reconcile` finds a credit a DBA deleted by hand and a credit inserted without its
// debit, and exits 1 naming each; once each is undone it reports the ledgers clean and exits 0.
// The reconcile package, which the command prints, is checked kind by kind.
func TestReconcileFindsHandEditedCredits(t *testing.T) {
	ctx := context.Background()
	settleAll(t)
	base := 1<<40 + mrand.Int64N(1<<40)
	m := move{src: accountOn("shard-0", base), dst: accountOn("shard-1", base), amount: 230, currency: "EUR", key: newKey()}
	m.id = applyMove(t, m)
	settleAll(t)
	dstShard := shardOf(m.dst)
	smap, cfgPath := currentMap(t)
	bin := buildRouter(t)
	cli := func() (int, string) {
		t.Helper()
		out, err := exec.Command(bin, "reconcile", "--config", cfgPath).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &ee):
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("router reconcile: %v\n%s", err, out)
		return 0, ""
	}
	expectClean := func(when string) {
		t.Helper()
		if rep := reconcileRun(t, smap); !rep.Clean() {
			t.Errorf("%s: reconcile is not clean:\n%s", when, printed(rep))
		}
		if code, out := cli(); code != 0 || !strings.Contains(out, "result: clean") {
			t.Errorf("%s: router reconcile exited %d:\n%s", when, code, out)
		}
	}
	expectFound := func(when string, kind reconcile.Kind, id string) {
		t.Helper()
		rep := reconcileRun(t, smap)
		if rep.Found[kind] != 1 || len(rep.Listed[kind]) != 1 || rep.Listed[kind][0].Leg.TransferID != id {
			t.Errorf("%s: reconcile found %v, listed %+v; want one %q for %s:\n%s", when, rep.Found, rep.Listed[kind], kind, id, printed(rep))
		}
		code, out := cli()
		if code != 1 || !strings.Contains(out, fmt.Sprintf("%s: 1\n", kind)) || !strings.Contains(out, id) {
			t.Errorf("%s: router reconcile exited %d, want 1 with one %q naming %s:\n%s", when, code, kind, id, out)
		}
	}
	expectClean("before any hand edit")

	// A credit deleted by hand: missing, and owed where it belongs.
	var row []byte
	if err := env.pools[dstShard].QueryRow(ctx, `DELETE FROM ledger_entries l WHERE kind = 'transfer_in' AND transfer_id = $1
		RETURNING to_jsonb(l)`, m.id).Scan(&row); err != nil {
		t.Fatal(err)
	}
	expectFound("credit deleted", reconcile.MissingCredit, m.id)
	if rep := reconcileRun(t, smap); len(rep.Listed[reconcile.MissingCredit]) == 1 && rep.Listed[reconcile.MissingCredit][0].Owner != dstShard {
		t.Errorf("the missing credit belongs on %s, the report says %s", dstShard, rep.Listed[reconcile.MissingCredit][0].Owner)
	}
	if _, err := env.pools[dstShard].Exec(ctx, `INSERT INTO ledger_entries OVERRIDING SYSTEM VALUE
		SELECT * FROM jsonb_populate_record(NULL::ledger_entries, $1)`, row); err != nil {
		t.Fatal(err)
	}
	expectClean("credit restored")

	// A credit without its debit: a copy of the real credit under a transfer id nobody debited.
	orphan := transferID(m.src, newKey())
	if _, err := env.pools[dstShard].Exec(ctx, `INSERT INTO ledger_entries
		(transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
		SELECT $1, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client
		  FROM ledger_entries WHERE kind = 'transfer_in' AND transfer_id = $2`, orphan, m.id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // also when an assertion below stops the test: later tests reconcile too
		env.pools[dstShard].Exec(ctx, "DELETE FROM ledger_entries WHERE transfer_id = $1", orphan) //nolint:errcheck // best effort
	})
	expectFound("credit without debit", reconcile.OrphanCredit, orphan)
	if _, err := env.pools[dstShard].Exec(ctx, "DELETE FROM ledger_entries WHERE transfer_id = $1", orphan); err != nil {
		t.Fatal(err)
	}
	expectClean("orphan credit removed")
}

// A balance read is authenticated like every other endpoint, refuses an account that is not a
// 64-bit integer, and an account without ledger rows has no balances.
func TestBalanceReadRefusals(t *testing.T) {
	for name, headers := range map[string]map[string]string{
		"no token":      {"Authorization": ""},
		"unknown token": {"Authorization": "Bearer not-a-token"},
	} {
		r := do(t, http.MethodGet, "/accounts/8842/balance", headers, "")
		if r.status != http.StatusUnauthorized || r.problemType() != "unauthorized" || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %v %s, want 401 unauthorized with a challenge", name, r.status, r.header, r.body)
		}
	}
	for _, id := range []string{"abc", "12x", "1.5", "9223372036854775808", "%20"} {
		r := do(t, http.MethodGet, "/accounts/"+id+"/balance", nil, "")
		if r.status != http.StatusBadRequest || r.problemType() != "invalid-account" {
			t.Errorf("account %q: %d %s, want 400 invalid-account", id, r.status, r.body)
		}
	}
	fresh := 1<<40 + mrand.Int64N(1<<40)
	r := do(t, http.MethodGet, fmt.Sprintf("/accounts/%d/balance", fresh), nil, "")
	var v struct {
		Account  int64             `json:"account"`
		Balances []json.RawMessage `json:"balances"`
	}
	if err := json.Unmarshal(r.body, &v); r.status != http.StatusOK || err != nil || v.Account != fresh || v.Balances == nil || len(v.Balances) != 0 {
		t.Errorf("account without rows: %d %s, want 200 with balances []", r.status, r.body)
	}
}

// move is one transfer of a credit test, and what the router called it.
type move struct {
	src, dst, amount int64
	currency         string
	key, id          string
	owed             bool // posted through a router whose relay is off: a pass delivers its credit
}

func (m move) crossShard() bool { return shardOf(m.src) != shardOf(m.dst) }

func moveBody(m move) string {
	return fmt.Sprintf(`{"src": %d, "dst": %d, "amount": %d, "currency": %q}`, m.src, m.dst, m.amount, m.currency)
}

// applyMove posts m as a new transfer to the suite's router and returns its id.
func applyMove(t testing.TB, m move) string {
	t.Helper()
	return applyMoveAt(t, env.url, m)
}

// applyMoveAt posts m as a new transfer to the router at base and returns its id.
func applyMoveAt(t testing.TB, base string, m move) string {
	t.Helper()
	r := postAt(t, base, m.key, moveBody(m))
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(r.body, &v); r.status != http.StatusCreated || err != nil || v.ID != transferID(m.src, m.key) {
		t.Fatalf("transfer %d -> %d: %d %s, want 201 with id %s", m.src, m.dst, r.status, r.body, transferID(m.src, m.key))
	}
	return v.ID
}

// transferView is the body of GET /transfers/{id}, as far as the credit tests read it.
type transferView struct {
	CreatedAt string `json:"created_at"`
	Credit    struct {
		State     string `json:"state"`
		SettledAt string `json:"settled_at"`
	} `json:"credit"`
}

func getTransfer(t testing.TB, id string) transferView {
	t.Helper()
	r := do(t, http.MethodGet, "/transfers/"+id, nil, "")
	var v transferView
	if err := json.Unmarshal(r.body, &v); r.status != http.StatusOK || err != nil {
		t.Fatalf("GET /transfers/%s: %d %s", id, r.status, r.body)
	}
	return v
}

// checkSettled checks that v, m's transfer, shows its credit settled: at the time the credit was
// written in the ledger of dst's shard when a relay pass delivered it, and no earlier than that
// when the router that wrote its debit did (its source shard's time of settling).
func checkSettled(t testing.TB, m move, v transferView) {
	t.Helper()
	settled, err := time.Parse(time.RFC3339Nano, v.Credit.SettledAt)
	if v.Credit.State != "settled" || err != nil {
		t.Errorf("%d -> %d: credit %+v, want settled with settled_at", m.src, m.dst, v.Credit)
		return
	}
	var written time.Time
	if err := env.pools[shardOf(m.dst)].QueryRow(context.Background(),
		"SELECT created_at FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_in'", m.id).Scan(&written); err != nil {
		t.Fatalf("%d -> %d: the credit on dst's shard %s: %v", m.src, m.dst, shardOf(m.dst), err)
	}
	if exact := m.owed || !m.crossShard(); exact && !settled.Equal(written) || settled.Before(written) {
		t.Errorf("%d -> %d: settled_at %s, the credit was written at %s", m.src, m.dst, settled, written)
	}
	if created, err := time.Parse(time.RFC3339Nano, v.CreatedAt); err != nil || settled.Before(created) {
		t.Errorf("%d -> %d: settled_at %s before the debit's created_at %q", m.src, m.dst, settled, v.CreatedAt)
	}
}

// position is an account's figures in one currency, as GET /accounts/{id}/balance has them.
type position struct {
	Currency   string `json:"currency"`
	Balance    int64  `json:"balance"`
	Credits    int64  `json:"credits"`
	Debits     int64  `json:"debits"`
	PendingOut int64  `json:"pending_out"`
}

// implied is what moves make of each account's balances: every debit applied, and each credit
// arrived, except, before the relay's pass (settled false), those owed by the router without a
// relay, which are pending out of their source.
func implied(moves []move, settled bool) map[int64]map[string]position {
	out := map[int64]map[string]position{}
	at := func(acct int64, cur string) position {
		if out[acct] == nil {
			out[acct] = map[string]position{}
		}
		return out[acct][cur]
	}
	for _, m := range moves {
		p := at(m.src, m.currency)
		p.Currency, p.Debits, p.Balance = m.currency, p.Debits+m.amount, p.Balance-m.amount
		pending := !settled && m.owed && m.crossShard()
		if pending {
			p.PendingOut += m.amount
		}
		out[m.src][m.currency] = p
		if !pending {
			q := at(m.dst, m.currency)
			q.Currency, q.Credits, q.Balance = m.currency, q.Credits+m.amount, q.Balance+m.amount
			out[m.dst][m.currency] = q
		}
	}
	return out
}

// checkBalances compares every account's balances with what moves imply; once settled, the
// balances of each currency also sum to zero over the accounts (all start empty).
func checkBalances(t testing.TB, accounts []int64, moves []move, settled bool) {
	t.Helper()
	want := implied(moves, settled)
	sums := map[string]int64{}
	for _, acct := range accounts {
		r := do(t, http.MethodGet, fmt.Sprintf("/accounts/%d/balance", acct), nil, "")
		var v struct {
			Account  int64      `json:"account"`
			Balances []position `json:"balances"`
		}
		if err := json.Unmarshal(r.body, &v); r.status != http.StatusOK || err != nil || v.Account != acct {
			t.Fatalf("balance of %d: %d %s", acct, r.status, r.body)
		}
		got := map[string]position{}
		for _, p := range v.Balances {
			got[p.Currency] = p
			sums[p.Currency] += p.Balance
		}
		if fmt.Sprint(got) != fmt.Sprint(want[acct]) {
			t.Errorf("balance of %d (settled=%t): %+v, want %+v", acct, settled, got, want[acct])
		}
	}
	for cur, sum := range sums {
		if settled && sum != 0 {
			t.Errorf("the %s balances of accounts that started empty sum to %d, want 0", cur, sum)
		}
	}
}

// owedCredits counts the credits every shard owes (its active ranges' pending rows).
func owedCredits(t testing.TB) int64 {
	t.Helper()
	var total int64
	for name, p := range env.pools {
		n, _, err := idem.OwedStats(context.Background(), p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		total += n
	}
	return total
}

// settleAll runs relay passes of the suite's router until no shard owes a credit (bounded: a
// credit whose delivery failed earlier waits out its backoff first).
func settleAll(t testing.TB) {
	t.Helper()
	env.svc.Relay.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		env.svc.Relay.Pass(context.Background())
		n := owedCredits(t)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d credits still owed after 30s of relay passes", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// creditRows counts the credits of transfer id on every shard.
func creditRows(t testing.TB, id string) int {
	t.Helper()
	total := 0
	for name, p := range env.pools {
		var n int
		if err := p.QueryRow(context.Background(),
			"SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_in'", id).Scan(&n); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		total += n
	}
	return total
}

// currentMap gives the shards a new map version with the suite's ranges (reconcile checks
// against the version the shards follow, and earlier tests moved it on) and returns the map and
// a router.yaml naming it, for `router reconcile`.
func currentMap(t testing.TB) (*shardmap.Map, string) {
	t.Helper()
	dir := t.TempDir()
	mapPath, cfgPath := filepath.Join(dir, "shardmap.yaml"), filepath.Join(dir, "router.yaml")
	if err := writeMap(mapPath, nextVersion(t), []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	m := mustLoad(t, mapPath)
	if _, err := rangemove.ApplyMap(context.Background(), m, shardPool, partition.Daily); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(routerYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return m, cfgPath
}

func shardPool(name string) *pgxpool.Pool { return env.pools[name] }

// reconcileRun checks every ledger against m; a debit of any age without its credit counts.
func reconcileRun(t testing.TB, m *shardmap.Map) reconcile.Report {
	t.Helper()
	rep, err := reconcile.Run(context.Background(), m, shardPool, reconcile.Options{})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return rep
}

func printed(rep reconcile.Report) string {
	var b strings.Builder
	rep.Print(&b)
	return b.String()
}
