package reconcile

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/relay"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// bank is three shards with real DSNs, a topology over them and a relay that delivers owed
// credits as `router serve`'s does. transfers is every transfer applied, for balances.
type bank struct {
	t         *testing.T
	m         *shardmap.Map
	pools     shardtest.Pools // the test's own connections
	topo      *topology.Topology
	relay     *relay.Relay
	transfers map[string][3]int64 // id -> src, dst, amount
}

func newBank(t *testing.T) *bank {
	t.Helper()
	b := &bank{t: t, pools: shardtest.New(t, "sa", "sb", "sc"), transfers: map[string][3]int64{}}
	b.m = testkit.ShardMap(t, 1, "sa=-55 sb=55-aa sc=aa-", func(name string) string { return b.pools[name].Config().ConnString() })
	b.pools.Grant(t, b.m)
	cfg, err := config.Parse("router.yaml", []byte("auth:\n  mode: none\n"))
	if err != nil {
		t.Fatal(err)
	}
	if b.topo, err = topology.Open(b.m, nil, cfg.ShardPool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.topo.Close)
	b.relay = relay.New(cfg, relay.NewOwner(), fixedTopology{b.topo}, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	return b
}

// fixedTopology gives the relay one topology for the whole test.
type fixedTopology struct{ t *topology.Topology }

func (f fixedTopology) HoldTopology() *topology.Topology { f.t.Hold(); return f.t }
func (f fixedTopology) ReloadAtLeast(int64) bool         { return true }

// pay applies a transfer's debit on its source's shard, as the router does; a credit across
// shards is then owed until the relay delivers it.
func (b *bank) pay(id string, src, dst, amount int64) {
	b.t.Helper()
	req := idem.TransferRequest{
		Kind: idem.Debit, Scope: "test:transfer", Key: id, RequestHash: "hash-" + id,
		KeyspaceID: shardmap.KeyspaceID(src), DstKeyspaceID: shardmap.KeyspaceID(dst),
		TransferID: id, Client: "test", Src: src, Dst: dst, Amount: amount, Currency: "EUR",
		Reference: "ref-" + id, Response: idem.Response{Status: 201}, Retention: 720 * time.Hour,
	}
	res, err := idem.TransferBatch(context.Background(), b.pools[b.m.Route(src).Shard], []idem.TransferRequest{req})
	if err != nil || res[0].Outcome != idem.Applied {
		b.t.Fatalf("debit %s: %v %v", id, res, err)
	}
	b.transfers[id] = [3]int64{src, dst, amount}
}

// deliver runs relay passes until nothing more is settled, and returns how many were.
func (b *bank) deliver() int {
	b.t.Helper()
	total := 0
	for range 5 {
		n := b.relay.Pass(context.Background())
		if total += n; n == 0 {
			return total
		}
	}
	b.t.Fatal("the relay kept settling credits after five passes")
	return total
}

func (b *bank) exec(shard, sql string, args ...any) {
	b.t.Helper()
	if _, err := b.pools[shard].Exec(context.Background(), sql, args...); err != nil {
		b.t.Fatalf("%s: %s: %v", shard, sql, err)
	}
}

// copyCredit writes a second copy of a transfer's credit from one shard onto another, under
// the given keyspace id.
func (b *bank) copyCredit(id, from, to string, keyspace uint64) {
	b.t.Helper()
	var acct, counter, amount int64
	var client string
	err := b.pools[from].QueryRow(context.Background(), `SELECT account_id, counterparty_id, amount, client FROM ledger_entries
		WHERE transfer_id = $1 AND kind = 'transfer_in'`, id).Scan(&acct, &counter, &amount, &client)
	if err != nil {
		b.t.Fatal(err)
	}
	b.exec(to, `INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, client)
		VALUES ($1, $2, $3, $4, $5, 'EUR', 'transfer_in', $6)`, id, int64(keyspace^1<<63), acct, counter, amount, client)
}

func (b *bank) check(window time.Duration) Report {
	b.t.Helper()
	r, err := Run(context.Background(), b.m, b.topo.Pool, Options{Window: window})
	if err != nil {
		b.t.Fatal(err)
	}
	return r
}

func (b *bank) repair(r Report) (int, string) {
	b.t.Helper()
	var out bytes.Buffer
	n, err := Repair(context.Background(), b.m, b.topo.Pool, r, &out)
	if err != nil {
		b.t.Fatal(err)
	}
	return n, out.String()
}

// balances reads every account's balance (credits minus debits) from the shard the map gives
// it, and compares it with what the transfers applied make it.
func (b *bank) checkBalances() {
	b.t.Helper()
	want := map[int64]int64{}
	for _, tr := range b.transfers {
		want[tr[0]] -= tr[2]
		want[tr[1]] += tr[2]
	}
	got := map[int64]int64{}
	for name, pool := range b.pools {
		rows, err := pool.Query(context.Background(), `SELECT account_id, sum(CASE kind WHEN 'transfer_in' THEN amount ELSE -amount END)::bigint
			FROM ledger_entries GROUP BY account_id`)
		if err != nil {
			b.t.Fatal(err)
		}
		for rows.Next() {
			var a, v int64
			if err := rows.Scan(&a, &v); err != nil {
				b.t.Fatal(err)
			}
			if b.m.Route(a).Shard != name {
				b.t.Errorf("account %d has ledger rows on %s, which the map does not give it", a, name)
			}
			got[a] += v
		}
		if err := rows.Err(); err != nil {
			b.t.Fatal(err)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		b.t.Errorf("balances %v, want %v", got, want)
	}
}

// only returns the one listed discrepancy of kind, failing unless there is exactly one.
func only(t *testing.T, r Report, k Kind) Discrepancy {
	t.Helper()
	if len(r.Listed[k]) != 1 {
		t.Fatalf("%s: listed %v, want one", k, r.Listed[k])
	}
	return r.Listed[k][0]
}

// Each kind of damage, planted by hand on transfers delivered by the relay a moment ago, is
// reported at once (no age threshold), exactly, on the shard where the row is.
func TestCategoriesPlantedByHand(t *testing.T) {
	b := newBank(t)
	a1, a2, b1, b2, c1, c2 := account(b.m, "sa", 1), account(b.m, "sa", 2), account(b.m, "sb", 1), account(b.m, "sb", 2), account(b.m, "sc", 1), account(b.m, "sc", 2)
	b.pay("t-settled-gone", a1, b1, 100)
	b.pay("t-both-gone", b1, c1, 200)
	b.pay("t-dup-foreign", a2, b2, 30)
	b.pay("t-dup-own", c1, a1, 40)
	b.pay("t-amount", a1, c2, 50)
	b.pay("t-orphan", a2, b1, 60)
	b.pay("t-fine", c2, b2, 70)
	if n := b.deliver(); n != 7 {
		t.Fatalf("relay settled %d credits, want 7", n)
	}
	if r := b.check(0); !r.Clean() {
		t.Fatalf("before any damage:\n%s", printed(r))
	}

	b.exec("sb", "DELETE FROM ledger_entries WHERE transfer_id = 't-settled-gone' AND kind = 'transfer_in'")
	b.exec("sc", "DELETE FROM ledger_entries WHERE transfer_id = 't-both-gone' AND kind = 'transfer_in'")
	b.exec("sb", "DELETE FROM shardgate_credit_outbox WHERE transfer_id = 't-both-gone'")
	b.copyCredit("t-dup-foreign", "sb", "sc", shardmap.KeyspaceID(c1)) // under sc's own keyspace
	b.copyCredit("t-dup-own", "sa", "sb", shardmap.KeyspaceID(a1))     // under the destination's keyspace id
	b.exec("sc", "UPDATE ledger_entries SET amount = 55 WHERE transfer_id = 't-amount' AND kind = 'transfer_in'")
	b.exec("sa", "DELETE FROM ledger_entries WHERE transfer_id = 't-orphan' AND kind = 'transfer_out'")
	b.exec("sa", "DELETE FROM shardgate_credit_outbox WHERE transfer_id = 't-orphan'")

	r := b.check(0)
	wantFound(t, r, map[Kind]int{MissingCredit: 2, OrphanCredit: 1, Mismatch: 1, Duplicate: 2})
	if r.Discrepancies() != 7 || r.Unbalanced() != 1 {
		t.Errorf("%d discrepancies, %d currencies unbalanced; want 6 and the one currency:\n%s", r.Discrepancies(), r.Unbalanced(), printed(r))
	}
	missing := map[string]Discrepancy{}
	for _, d := range r.Listed[MissingCredit] {
		missing[d.Leg.TransferID] = d
	}
	if d := missing["t-settled-gone"]; d.Leg.Shard != "sa" || d.Owner != "sb" || d.Owed != OwedSettled || d.OwedOn != "sa" || d.Leg.Amount != 100 {
		t.Errorf("t-settled-gone: %+v, want its debit on sa, credit belonging on sb, its owed row on sa settled", d)
	}
	if d := missing["t-both-gone"]; d.Leg.Shard != "sb" || d.Owner != "sc" || d.Owed != NoOwedRow || d.Leg.Amount != 200 {
		t.Errorf("t-both-gone: %+v, want its debit on sb, credit belonging on sc, no owed row", d)
	}
	if len(r.Missing) != 2 {
		t.Errorf("Missing holds %d, want both", len(r.Missing))
	}
	dups := map[string]Discrepancy{}
	for _, d := range r.Listed[Duplicate] {
		dups[d.Leg.TransferID] = d
	}
	if d := dups["t-dup-foreign"]; d.Leg.Shard != "sc" || d.Leg.Place != Owned || d.Leg.Debit || d.Other == nil || d.Other.Shard != "sb" {
		t.Errorf("t-dup-foreign: %+v, want the extra credit on sc (in a range sc owns), the one that counts on sb", d)
	}
	if d := dups["t-dup-own"]; d.Leg.Shard != "sb" || d.Leg.Place != Unowned || d.Leg.KeyspaceID != shardmap.KeyspaceID(a1) || d.Other == nil || d.Other.Shard != "sa" {
		t.Errorf("t-dup-own: %+v, want the extra credit on sb under sa's keyspace id, the one that counts on sa", d)
	}
	if d := only(t, r, Mismatch); d.Leg.TransferID != "t-amount" || d.Leg.Amount != 50 || d.Other.Amount != 55 || d.Other.Shard != "sc" {
		t.Errorf("mismatch %+v (credit %+v), want t-amount: debit 50, credit 55 on sc", d, d.Other)
	}
	o := only(t, r, OrphanCredit).Leg
	if o.TransferID != "t-orphan" || o.Shard != "sb" || o.Src != a2 || o.Dst != b1 || o.Amount != 60 || o.Client != "test" || o.Reference != "ref-t-orphan" {
		t.Errorf("credit without debit %+v, want t-orphan's on sb, %d -> %d, 60, with its client and reference", o, a2, b1)
	}
	// Sum over every row: +30 +40 (copies) +5 (amount) +60 (orphan); the missing 300 listed.
	if eur := r.Currencies[0]; eur.Debits-eur.Credits != 300-30-40-5-60 || eur.Missing != 300 {
		t.Errorf("EUR %+v: debits - credits should be 300 missing less 135 too many", eur)
	}
	out := printed(r)
	for _, want := range []string{
		"missing credit: 2", "its owed-credit row on sa says settled", "no owed-credit row",
		fmt.Sprintf("to reverse: debit account %d by 60 EUR on sb", b1),
		fmt.Sprintf("extra copy under keyspace id %016x (unowned on sb)", shardmap.KeyspaceID(a1)),
		"leg counted twice: 2", "result: 7 discrepancies",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Repair owes again the credits lost behind a settled owed row (one of them on the same shard
// as its debit, one whose record outlived it) and behind no owed row; the relay delivers each
// once, every balance is exact and the check is clean. A second repair does nothing, and a
// credit without debit is reported and never given an invented debit.
func TestRepairThenRelay(t *testing.T) {
	b := newBank(t)
	a1, a2, b1, c1 := account(b.m, "sa", 1), account(b.m, "sa", 2), account(b.m, "sb", 1), account(b.m, "sc", 1)
	b.pay("t-settled-gone", a1, b1, 100)
	b.pay("t-both-gone", b1, c1, 200)
	b.pay("t-local-gone", a1, a2, 300)
	b.pay("t-kept", c1, a2, 400)
	b.pay("t-orphan", a2, c1, 500)
	b.deliver()
	b.exec("sb", "DELETE FROM ledger_entries WHERE transfer_id = 't-settled-gone' AND kind = 'transfer_in'")
	b.exec("sc", "DELETE FROM ledger_entries WHERE transfer_id = 't-both-gone' AND kind = 'transfer_in'")
	b.exec("sc", "DELETE FROM idempotency_record WHERE key = 't-both-gone'") // lost with its credit
	b.exec("sb", "DELETE FROM shardgate_credit_outbox WHERE transfer_id = 't-both-gone'")
	b.exec("sa", "DELETE FROM ledger_entries WHERE transfer_id = 't-local-gone' AND kind = 'transfer_in'")
	b.exec("sa", "DELETE FROM ledger_entries WHERE transfer_id = 't-orphan' AND kind = 'transfer_out'")
	b.exec("sa", "DELETE FROM shardgate_credit_outbox WHERE transfer_id = 't-orphan'")
	delete(b.transfers, "t-orphan")

	r := b.check(0)
	wantFound(t, r, map[Kind]int{MissingCredit: 3, OrphanCredit: 1})
	n, out := b.repair(r)
	if n != 3 {
		t.Errorf("repair owed %d credits, want 3:\n%s", n, out)
	}
	for _, want := range []string{
		"t-settled-gone: owed again on sa, its owed-credit row no longer settled",
		"t-both-gone: owed-credit row written again on sb from its debit",
		"t-local-gone: owed-credit row written again on sa from its debit",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("repair output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "t-orphan") {
		t.Errorf("repair acted on the credit without debit:\n%s", out)
	}
	after := b.check(0)
	wantFound(t, after, map[Kind]int{OrphanCredit: 1})
	if eur := after.Currencies[0]; eur.PendingCount != 3 || eur.Pending != 600 {
		t.Errorf("after repair, before the relay: EUR %+v, want 600 pending over 3 credits", eur)
	}
	if n, out := b.repair(after); n != 0 || out != "" {
		t.Errorf("second repair owed %d:\n%s", n, out)
	}

	if n := b.deliver(); n != 3 {
		t.Errorf("relay settled %d credits after repair, want 3", n)
	}
	// The credit without debit is the one damage left; take it back out as an operator would
	// once reversed, and every balance is exact.
	b.exec("sc", "DELETE FROM ledger_entries WHERE transfer_id = 't-orphan'")
	b.checkBalances()
	final := b.check(0)
	if !final.Clean() {
		t.Errorf("after repair and relay:\n%s", printed(final))
	}
	if n, out := b.repair(final); n != 0 || out != "" {
		t.Errorf("repair of a clean ledger owed %d:\n%s", n, out)
	}
	if n := b.deliver(); n != 0 {
		t.Errorf("relay delivered %d more after a clean check", n)
	}
	var debits int
	if err := b.pools["sa"].QueryRow(context.Background(), "SELECT count(*) FROM ledger_entries WHERE transfer_id = 't-orphan'").Scan(&debits); err != nil || debits != 0 {
		t.Errorf("t-orphan has %d rows on sa (%v): repair invented a debit", debits, err)
	}
}
