package reconcile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/shardmap"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// cluster is the shards of one test, each a migrated database of the test server, and the map
// they follow.
type cluster struct {
	t     *testing.T
	m     *shardmap.Map
	pools shardtest.Pools
}

// newCluster makes a shard for every shard of the map of version v with owners (see mapOf)
// and grants each its ranges.
func newCluster(t *testing.T, v int64, owners string) *cluster {
	m := mapOf(t, v, owners)
	return &cluster{t: t, m: m, pools: shardtest.ForMap(t, m)}
}

// mapOf parses a map of version v; owners is as testkit.ShardMap's.
func mapOf(t *testing.T, v int64, owners string) *shardmap.Map {
	t.Helper()
	return testkit.ShardMap(t, v, owners, testkit.UnusedDSN)
}

// grant makes every shard of m own its ranges of m (a range it owned before and m does not
// give it stays, inactive, as moving) and makes m the map the cluster is checked against.
func (c *cluster) grant(m *shardmap.Map) {
	c.t.Helper()
	c.pools.Grant(c.t, m)
	c.m = m
}

// account returns the n-th account (from 1) that m places on shard.
func account(m *shardmap.Map, shard string, n int) int64 {
	for a := int64(1); ; a++ {
		if m.Route(a).Shard == shard {
			if n--; n == 0 {
				return a
			}
		}
	}
}

func (c *cluster) run(window time.Duration) Report {
	c.t.Helper()
	r, err := Run(context.Background(), c.m, func(s string) *pgxpool.Pool { return c.pools[s] }, Options{Window: window})
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

func leg(kind idem.Kind, id string, src, dst, amount int64, currency string) idem.TransferRequest {
	r := idem.TransferRequest{
		Kind: kind, Scope: "test:transfer", Key: id, RequestHash: "hash-" + id,
		KeyspaceID: shardmap.KeyspaceID(src), DstKeyspaceID: shardmap.KeyspaceID(dst),
		TransferID: id, Client: "test", Src: src, Dst: dst, Amount: amount, Currency: currency,
		Response: idem.Response{Status: 201}, Retention: 720 * time.Hour,
	}
	if kind == idem.Credit {
		r.Scope, r.KeyspaceID, r.DstKeyspaceID = "shardgate:credit", shardmap.KeyspaceID(dst), 0
	}
	return r
}

// apply runs legs, which must all be for the shard that owns the first one's account, and
// checks that each applied.
func (c *cluster) apply(legs ...idem.TransferRequest) []idem.TransferResult {
	c.t.Helper()
	account := legs[0].Src
	if legs[0].Kind == idem.Credit {
		account = legs[0].Dst
	}
	res, err := idem.TransferBatch(context.Background(), c.pools[c.m.Route(account).Shard], legs)
	if err != nil {
		c.t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != idem.Applied {
			c.t.Fatalf("%s of %s: %s", legs[i].Kind, legs[i].TransferID, r.Outcome)
		}
	}
	return res
}

// debit applies the debit of a transfer and reports whether its shard wrote the credit too.
func (c *cluster) debit(id string, src, dst, amount int64, currency string) (creditWritten bool) {
	c.t.Helper()
	return c.apply(leg(idem.Debit, id, src, dst, amount, currency))[0].CreditSettled
}

// transfer applies a transfer's debit and, when it is owed, delivers its credit as the relay does.
func (c *cluster) transfer(id string, src, dst, amount int64, currency string) {
	c.t.Helper()
	if !c.debit(id, src, dst, amount, currency) {
		c.apply(leg(idem.Credit, id, src, dst, amount, currency))
	}
}

func (c *cluster) exec(shard, sql string, args ...any) {
	c.t.Helper()
	if _, err := c.pools[shard].Exec(context.Background(), sql, args...); err != nil {
		c.t.Fatal(err)
	}
}

// backdate makes every ledger row of the transfers older by d, on every shard.
func (c *cluster) backdate(d time.Duration, ids ...string) {
	c.t.Helper()
	for name := range c.pools {
		c.exec(name, "UPDATE ledger_entries SET created_at = created_at - $1::interval WHERE transfer_id = ANY($2)", d, ids)
	}
}

func wantFound(t *testing.T, r Report, want map[Kind]int) {
	t.Helper()
	for _, k := range Kinds {
		if r.Found[k] != want[k] {
			t.Errorf("%s: found %d, want %d", k, r.Found[k], want[k])
		}
	}
}

func listedIDs(r Report, k Kind) []string {
	var ids []string
	for _, d := range r.Listed[k] {
		ids = append(ids, d.Leg.TransferID)
	}
	return ids
}

func printed(r Report) string {
	var b bytes.Buffer
	r.Print(&b)
	return b.String()
}

// Three shards, transfers within one shard (the debit writes the credit) and across shards
// (the credit delivered as the relay does): clean.
func TestCleanLedger(t *testing.T) {
	c := newCluster(t, 1, "sa=-55 sb=55-aa sc=aa-")
	a1, a2, b1, c1 := account(c.m, "sa", 1), account(c.m, "sa", 2), account(c.m, "sb", 1), account(c.m, "sc", 1)
	if !c.debit("t-same", a1, a2, 100, "EUR") {
		t.Fatal("a debit whose shard owns dst did not write the credit")
	}
	c.transfer("t-ab", a1, b1, 250, "EUR")
	c.transfer("t-bc", b1, c1, 40, "USD")
	c.transfer("t-ca", c1, a2, 7, "USD")
	c.backdate(2*time.Hour, "t-same", "t-ab", "t-bc", "t-ca")

	r := c.run(0)
	if !r.Clean() || r.Discrepancies() != 0 {
		t.Errorf("clean ledger reported %d discrepancies:\n%s", r.Discrepancies(), printed(r))
	}
	wantFound(t, r, nil)
	want := []CurrencyTotal{{Currency: "EUR", Debits: 350, Credits: 350}, {Currency: "USD", Debits: 47, Credits: 47}}
	if fmt.Sprint(r.Currencies) != fmt.Sprint(want) || r.Debits != 4 || r.Credits != 4 {
		t.Errorf("read %d debits, %d credits, totals %v; want 4, 4, %v", r.Debits, r.Credits, r.Currencies, want)
	}
	if r.OldestPending != nil {
		t.Errorf("oldest pending %+v in a ledger with every credit", *r.OldestPending)
	}
	if out := printed(r); !strings.Contains(out, "result: clean") || !strings.Contains(out, "no pending credits") {
		t.Errorf("report of a clean ledger:\n%s", out)
	}
}

// A credit deleted by hand, delivered (across shards, its owed-credit row settled) or written
// with its debit (same shard, no owed-credit row), is missing; the listing names where it
// belongs.
func TestDeletedCreditIsMissing(t *testing.T) {
	c := newCluster(t, 1, "sa=-80 sb=80-")
	a1, a2, b1 := account(c.m, "sa", 1), account(c.m, "sa", 2), account(c.m, "sb", 1)
	c.transfer("t-gone", a1, b1, 100, "EUR")
	c.transfer("t-gone-local", a1, a2, 30, "EUR")
	c.transfer("t-kept", b1, a1, 5, "EUR")
	c.exec("sb", "DELETE FROM ledger_entries WHERE transfer_id = 't-gone' AND kind = 'transfer_in'")
	c.exec("sa", "DELETE FROM ledger_entries WHERE transfer_id = 't-gone-local' AND kind = 'transfer_in'")
	c.exec("sa", "UPDATE shardgate_credit_outbox SET settled_at = now()")
	c.exec("sb", "UPDATE shardgate_credit_outbox SET settled_at = now()")
	c.backdate(2*time.Hour, "t-gone", "t-gone-local", "t-kept")

	r := c.run(0)
	if r.Clean() {
		t.Fatalf("deleted credits not found:\n%s", printed(r))
	}
	wantFound(t, r, map[Kind]int{MissingCredit: 2})
	listed := r.Listed[MissingCredit]
	if len(listed) != 2 {
		t.Fatalf("listed %v, want both missing credits", listedIDs(r, MissingCredit))
	}
	got := listed[0] // t-gone was written first, so it is the older
	if l := got.Leg; l.TransferID != "t-gone" || l.Shard != "sa" || got.Owner != "sb" || l.Src != a1 || l.Dst != b1 ||
		l.Amount != 100 || l.Currency != "EUR" || l.Age < 2*time.Hour {
		t.Errorf("first listed %+v (leg %+v), want t-gone debited on sa, its credit belonging on sb, 2h old", got, got.Leg)
	}
	if listed[1].Leg.TransferID != "t-gone-local" || listed[1].Owner != "sa" {
		t.Errorf("second listed %+v, want t-gone-local, belonging on sa", listed[1])
	}
	eur := r.Currencies[0]
	if eur.Missing != 130 || eur.Pending != 0 || !eur.Balanced() || r.Discrepancies() != 2 {
		t.Errorf("EUR %+v, %d discrepancies; want 130 missing, none pending, balanced, 2 discrepancies", eur, r.Discrepancies())
	}
	if r.OldestPending != nil {
		t.Errorf("oldest pending %v, want none", r.OldestPending)
	}
	out := printed(r)
	for _, want := range []string{"missing credit: 2", "t-gone", "credit belongs on sb", "result: 2 discrepancies"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Credits written without their debits are found, listed oldest first (ties by id) up to
// MaxListed, and unbalance their currency.
func TestCreditWithoutDebit(t *testing.T) {
	c := newCluster(t, 1, "sa=-80 sb=80-")
	a1, b1 := account(c.m, "sa", 1), account(c.m, "sb", 1)
	const n = MaxListed + 2
	var credits []idem.TransferRequest
	for i := range n {
		credits = append(credits, leg(idem.Credit, fmt.Sprintf("t-orphan-%02d", i), a1, b1, 10, "USD"))
	}
	c.apply(credits...)
	c.transfer("t-fine", a1, b1, 60, "USD")

	r := c.run(0)
	wantFound(t, r, map[Kind]int{OrphanCredit: n})
	ids := listedIDs(r, OrphanCredit)
	if len(ids) != MaxListed || ids[0] != "t-orphan-00" || ids[MaxListed-1] != fmt.Sprintf("t-orphan-%02d", MaxListed-1) {
		t.Errorf("listed %v, want t-orphan-00 to t-orphan-%02d", ids, MaxListed-1)
	}
	if d := r.Listed[OrphanCredit][0]; d.Leg.Shard != "sb" || d.Leg.Debit || d.Leg.Src != a1 || d.Leg.Dst != b1 {
		t.Errorf("listed %+v, want a credit on sb from %d to %d", d.Leg, a1, b1)
	}
	usd := r.Currencies[0]
	if usd.Debits != 60 || usd.Credits != 60+n*10 || usd.Balanced() || r.Clean() || r.Discrepancies() != n+1 {
		t.Errorf("USD %+v, %d discrepancies; want unbalanced, %d discrepancies", usd, r.Discrepancies(), n+1)
	}
	out := printed(r)
	for _, want := range []string{fmt.Sprintf("credit without debit: %d", n), "... and 2 more", "NO: debits - credits - pending - missing = -220"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// A debit whose credit is owed and not delivered yet is pending, not a discrepancy, whatever its
// age, and the oldest such is reported; once its owed-credit row says settled without the
// credit, it is missing at once.
func TestPendingCredit(t *testing.T) {
	c := newCluster(t, 1, "sa=-55 sb=55-aa sc=aa-")
	a1, b1, c1 := account(c.m, "sa", 1), account(c.m, "sb", 1), account(c.m, "sc", 1)
	if c.debit("t-new", a1, b1, 75, "EUR") || c.debit("t-older", a1, c1, 75, "EUR") {
		t.Fatal("a credit across shards was written with its debit")
	}
	c.backdate(30*time.Minute, "t-older")

	r := c.run(0)
	if !r.Clean() {
		t.Errorf("pending credits reported as discrepancies:\n%s", printed(r))
	}
	wantFound(t, r, nil)
	p := r.OldestPending
	if p == nil || p.TransferID != "t-older" || p.Age < 30*time.Minute || p.Age > 31*time.Minute || p.Shard != "sa" {
		t.Errorf("oldest pending %+v, want t-older, 30m old, debited on sa", p)
	}
	if eur := r.Currencies[0]; eur.Pending != 150 || eur.PendingCount != 2 || eur.Credits != 0 || !eur.Balanced() {
		t.Errorf("EUR %+v, want 150 pending over 2 debits, balanced", eur)
	}
	if out := printed(r); !strings.Contains(out, "oldest pending credit: t-older, debited 30m") {
		t.Errorf("report does not name the oldest pending credit:\n%s", out)
	}

	c.exec("sa", "UPDATE shardgate_credit_outbox SET settled_at = now() WHERE transfer_id = 't-older'")
	r = c.run(0)
	wantFound(t, r, map[Kind]int{MissingCredit: 1})
	if ids := listedIDs(r, MissingCredit); len(ids) != 1 || ids[0] != "t-older" {
		t.Errorf("missing once settled: %v, want [t-older]", ids)
	}
}

// A credit whose amount, currency or destination differs from its debit's is found, and the
// currencies no longer balance.
func TestCreditDiffersFromDebit(t *testing.T) {
	c := newCluster(t, 1, "sa=-80 sb=80-")
	a1, b1, b2 := account(c.m, "sa", 1), account(c.m, "sb", 1), account(c.m, "sb", 2)
	c.debit("t-amount", a1, b1, 100, "EUR")
	c.apply(leg(idem.Credit, "t-amount", a1, b1, 90, "EUR"))
	c.debit("t-currency", a1, b1, 10, "USD")
	c.apply(leg(idem.Credit, "t-currency", a1, b1, 10, "GBP"))
	c.debit("t-account", a1, b1, 5, "USD")
	c.apply(leg(idem.Credit, "t-account", a1, b2, 5, "USD"))
	c.transfer("t-fine", a1, b1, 1, "USD")

	r := c.run(0)
	wantFound(t, r, map[Kind]int{Mismatch: 3})
	got := map[string]Discrepancy{}
	for _, d := range r.Listed[Mismatch] {
		got[d.Leg.TransferID] = d
	}
	for id, ok := range map[string]func(debit Leg, credit *Leg) bool{
		"t-amount":   func(d Leg, c *Leg) bool { return d.Amount == 100 && c.Amount == 90 },
		"t-currency": func(d Leg, c *Leg) bool { return d.Currency == "USD" && c.Currency == "GBP" },
		"t-account":  func(d Leg, c *Leg) bool { return d.Dst == b1 && c.Dst == b2 && c.Shard == "sb" },
	} {
		if d, found := got[id]; !found || d.Other == nil || !d.Leg.Debit || !ok(d.Leg, d.Other) {
			t.Errorf("%s: listed %+v (credit %+v), want the debit and its differing credit", id, d, d.Other)
		}
	}
	for _, cur := range r.Currencies {
		if cur.Balanced() {
			t.Errorf("%+v balances, but a credit differs from its debit in %s", cur, cur.Currency)
		}
	}
	if r.Clean() || r.Discrepancies() != 6 {
		t.Errorf("%d discrepancies, want 3 mismatches and 3 unbalanced currencies", r.Discrepancies())
	}
}

// Rows of an inactive range are not counted. Version 1 gives sa everything; version 2 gives
// sb "80-" and was granted but not settled, so sa still holds its "80-" rows, inactive, and sb
// holds copies of some of them. A copied leg is counted once (no duplicate), and a leg left
// only in sa's inactive range is not counted at all: its credit is missing, or its credit has
// no debit.
func TestInactiveRangeNotCounted(t *testing.T) {
	c := newCluster(t, 1, "sa=- sb=")
	v2 := mapOf(t, 2, "sa=-80 sb=80-")
	a, b := account(v2, "sa", 1), account(v2, "sb", 1)
	for _, tr := range []struct {
		id       string
		src, dst int64
	}{{"t-stranded", a, b}, {"t-copied", a, b}, {"t-copied-debit", b, a}, {"t-left-debit", b, a}} {
		if !c.debit(tr.id, tr.src, tr.dst, 100, "EUR") {
			t.Fatalf("%s: sa owns everything and did not write the credit", tr.id)
		}
	}
	c.grant(v2)
	c.copyLeg("t-copied", idem.Credit, "sa", "sb")
	c.copyLeg("t-copied-debit", idem.Debit, "sa", "sb")
	c.backdate(2*time.Hour, "t-stranded", "t-copied", "t-copied-debit", "t-left-debit")

	r := c.run(0)
	wantFound(t, r, map[Kind]int{MissingCredit: 1, OrphanCredit: 1})
	if ids := listedIDs(r, MissingCredit); len(ids) != 1 || ids[0] != "t-stranded" || r.Listed[MissingCredit][0].Owner != "sb" {
		t.Errorf("missing credits %v, want t-stranded's, belonging on sb", r.Listed[MissingCredit])
	}
	if ids := listedIDs(r, OrphanCredit); len(ids) != 1 || ids[0] != "t-left-debit" {
		t.Errorf("credits without debit %v, want t-left-debit's", ids)
	}
	if r.Debits != 3 || r.Credits != 3 {
		t.Errorf("read %d debits and %d credits, want 3 and 3: the inactive rows counted", r.Debits, r.Credits)
	}
}

// copyLeg copies a ledger row from one shard to another, as a range move does.
func (c *cluster) copyLeg(id string, kind idem.Kind, from, to string) {
	c.t.Helper()
	const cols = "transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client, created_at"
	vals := make([]any, 10)
	ptrs := make([]any, 10)
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	err := c.pools[from].QueryRow(context.Background(), "SELECT "+cols+" FROM ledger_entries WHERE transfer_id = $1 AND kind = $2", id, string(kind)).Scan(ptrs...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.exec(to, "INSERT INTO ledger_entries ("+cols+") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)", vals...)
}

// Rows written after the check began are not counted: here a credit without debit, and a
// debit without credit, dated an hour ahead.
func TestRowsWrittenAfterTheStartAreNotCounted(t *testing.T) {
	c := newCluster(t, 1, "sa=-80 sb=80-")
	a1, b1 := account(c.m, "sa", 1), account(c.m, "sb", 1)
	c.apply(leg(idem.Credit, "t-late-credit", a1, b1, 10, "USD"))
	c.debit("t-late-debit", a1, b1, 10, "USD")
	c.backdate(-time.Hour, "t-late-credit", "t-late-debit")

	r := c.run(0)
	if !r.Clean() || r.Debits != 0 || r.Credits != 0 {
		t.Errorf("rows written after the start counted: %d debits, %d credits:\n%s", r.Debits, r.Credits, printed(r))
	}
}

// The check refuses to conclude anything while shards do not follow the map it is given.
func TestUnsettledOwnershipIsRefused(t *testing.T) {
	c := newCluster(t, 1, "sa=-80 sb=80-")
	pools := func(s string) *pgxpool.Pool { return c.pools[s] }
	swapped := func(s string) *pgxpool.Pool { return c.pools[map[string]string{"sa": "sb", "sb": "sa"}[s]] }
	check := func(name string, m *shardmap.Map, pool func(string) *pgxpool.Pool, shard, says string) {
		t.Helper()
		_, err := Run(context.Background(), m, pool, Options{})
		var se *ShardError
		if !errors.Is(err, ErrUnsettled) || !errors.As(err, &se) || se.Shard != shard || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrUnsettled on shard %s saying %q", name, err, shard, says)
		}
	}
	check("another version", mapOf(t, 3, "sa=-80 sb=80-"), pools, "sa", "follows shard map version 1, the map checked is version 3")
	check("DSNs swapped", c.m, swapped, "sa", `its database says it is shard "sb"`)

	revoke := idem.Ownership{Shard: "sb", MapVersion: 2, Ranges: mapOf(t, 2, "sa=- sb=").Ownership()["sb"]}
	if err := idem.ApplyOwnership(context.Background(), c.pools["sb"], revoke, idem.Revoke); err != nil {
		t.Fatal(err)
	}
	check("apply begun", c.m, pools, "sb", "the apply of shard map version 2 has begun")
}

// Errors name the shard, keep their cause for errors.Is, and never print its password; a shard
// without a pool is refused before anything is read.
func TestShardErrors(t *testing.T) {
	s := shardmap.Shard{Name: "sx", DSN: "postgres://ledger:hunter2@db.internal/ledger"}
	err := shardError(s, fmt.Errorf("connect to %s: %w", s.DSN, context.DeadlineExceeded))
	if strings.Contains(err.Error(), "hunter2") || !strings.HasPrefix(err.Error(), "shard sx: ") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shard error %q: want it to name sx, hide the password and wrap the cause", err)
	}
	m := mapOf(t, 1, "sa=-80 sb=80-")
	_, err = Run(context.Background(), m, func(string) *pgxpool.Pool { return nil }, Options{})
	if err == nil || !strings.Contains(err.Error(), "shard sa: no connection pool") {
		t.Errorf("run without pools: %v, want shard sa named", err)
	}
	if _, err := Run(context.Background(), m, func(string) *pgxpool.Pool { return nil }, Options{Window: -time.Second}); err == nil {
		t.Error("a negative Window was accepted")
	}
}
