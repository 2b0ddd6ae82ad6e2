package idem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Keyspace ids of the tests' accounts: halfShard owns "-80", so here is one of its own and
// there one it does not own.
const (
	here  uint64 = 42
	there uint64 = 0x9000000000000000
)

// debitTo is testTransfer with its destination's keyspace id set.
func debitTo(key string, amount int64, dst uint64) TransferRequest {
	r := testTransfer(key, amount)
	r.DstKeyspaceID = dst
	return r
}

// legs returns the debits and credits of transfer id and whether it has an owed-credit row.
func legs(t *testing.T, pool *pgxpool.Pool, id string) (debits, credits int, owed bool) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'),
		(SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_in'),
		EXISTS (SELECT 1 FROM shardgate_credit_outbox WHERE transfer_id = $1)`, id).Scan(&debits, &credits, &owed)
	if err != nil {
		t.Fatal(err)
	}
	return debits, credits, owed
}

// A debit whose destination this shard owns writes the credit in its own transaction; any other
// debit records its credit as owed. A retry replays and writes neither again.
func TestDebitWritesOrOwesItsCredit(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)

	local := transferOutcome(t, pool, debitTo("local", 10, here), Applied)
	if !local.CreditSettled {
		t.Error("a debit to an account of its own shard left its credit owed")
	}
	if d, c, owed := legs(t, pool, "t-local"); d != 1 || c != 1 || owed {
		t.Errorf("same-shard transfer: %d debits, %d credits, owed row %v; want 1, 1, none", d, c, owed)
	}
	var acct, counter, ks int64
	if err := pool.QueryRow(ctx, `SELECT account_id, counterparty_id, keyspace_id FROM ledger_entries
		WHERE transfer_id = 't-local' AND kind = 'transfer_in'`).Scan(&acct, &counter, &ks); err != nil {
		t.Fatal(err)
	}
	if acct != 2 || counter != 1 || ks != signedKeyspace(here) {
		t.Errorf("credit is account %d, counterparty %d, keyspace %d; want 2, 1, %d", acct, counter, ks, signedKeyspace(here))
	}

	remote := transferOutcome(t, pool, debitTo("remote", 10, there), Applied)
	if remote.CreditSettled {
		t.Error("a debit to another shard's account says its credit is settled")
	}
	if d, c, owed := legs(t, pool, "t-remote"); d != 1 || c != 0 || !owed {
		t.Errorf("cross-shard transfer: %d debits, %d credits, owed row %v; want 1, 0, one", d, c, owed)
	}

	transferOutcome(t, pool, debitTo("local", 10, here), Replayed)
	transferOutcome(t, pool, debitTo("remote", 10, there), Replayed)
	for _, id := range []string{"t-local", "t-remote"} {
		if d, c, _ := legs(t, pool, id); d != 1 || c > 1 {
			t.Errorf("%s after a replay: %d debits, %d credits", id, d, c)
		}
	}
	owed, oldest, err := OwedStats(ctx, pool)
	if err != nil || owed != 1 || time.Since(oldest) > time.Minute {
		t.Errorf("OwedStats = %d, %v, %v; want 1 credit owed since just now", owed, oldest, err)
	}
}

// The credit leg goes through the claim path with its ledger row as its record, through both
// group functions: delivered again it replays, a different credit under the same transfer id is
// refused, a shard that does not own dst refuses it, and no idempotency record is written for it
// (none is read either: a credit record an earlier release wrote does not keep a credit that is
// gone from the ledger from applying).
func TestCreditLegIsAppliedOnce(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) { creditLegIsAppliedOnce(t, q) })
	}
}

// creditLegIsAppliedOnce is TestCreditLegIsAppliedOnce through the group function of q. Each
// credit goes in a group with new debits, so that the set-wise function sees a mixed group.
func creditLegIsAppliedOnce(t *testing.T, q string) {
	ctx := context.Background()
	pool := halfShard(t)
	groups := 0
	deliver := func(credit TransferRequest, want Outcome) TransferResult {
		t.Helper()
		group := []TransferRequest{credit}
		if groups++; q == batchSQL {
			for i := range 3 {
				group = append(group, testTransfer(fmt.Sprintf("debit-%d-%d", groups, i), 10))
			}
		}
		res, err := transferGroup(ctx, pool, group, q)
		if err != nil || res[0].Outcome != want {
			t.Fatalf("credit %s: %+v %v, want %s", credit.Key, res, err, want)
		}
		for i, r := range res[1:] {
			if r.Outcome != Applied {
				t.Fatalf("debit %d of the credit's group: %s, want applied", i, r.Outcome)
			}
		}
		return res[0]
	}
	owed := OwedCredit{TransferID: "t-x", Src: 7, Dst: 8, Amount: 25, Currency: "EUR", Client: "client-a", DebitedAt: time.Now()}
	credit := CreditRequest(owed, here, 720*time.Hour)
	deliver(credit, Applied)
	if r := deliver(credit, Replayed); r.Response.Status != 201 {
		t.Errorf("a credit's replay answers %+v, want its 201", r.Response)
	}

	for _, change := range []func(*OwedCredit){
		func(c *OwedCredit) { c.Amount = 26 },
		func(c *OwedCredit) { c.Src = 9 },
		func(c *OwedCredit) { c.Reference = "other" },
		func(c *OwedCredit) { c.Client = "client-b" },
	} {
		other := owed
		change(&other)
		deliver(CreditRequest(other, here, 720*time.Hour), KeyReused)
	}
	transferOutcome(t, pool, CreditRequest(owed, there, 720*time.Hour), NotOwner)
	var records int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_record WHERE scope = $1", CreditScope).Scan(&records); err != nil || records != 0 {
		t.Fatalf("%d credit records (%v), want none: a credit's ledger row is its record", records, err)
	}
	if d, c, _ := legs(t, pool, "t-x"); d != 0 || c != 1 {
		t.Fatalf("%d debits and %d credits, want the one credit", d, c)
	}

	// A credit deleted by hand, with the record an earlier release wrote for it left behind: it
	// applies again, once.
	mustExec(t, pool, "DELETE FROM ledger_entries WHERE transfer_id = 't-x'")
	mustExec(t, pool, `INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
		VALUES ('t-x', $1, $2, 42, '{"status": 201}', 'completed')`, CreditScope, credit.RequestHash)
	deliver(credit, Applied)
	deliver(credit, Replayed)
	if d, c, _ := legs(t, pool, "t-x"); d != 0 || c != 1 {
		t.Fatalf("after the credit was deleted by hand: %d debits and %d credits, want the one credit", d, c)
	}

	got, err := CreditTimes(ctx, pool, []string{"t-x", "t-none"})
	if err != nil || len(got) != 1 || got["t-x"].IsZero() {
		t.Errorf("CreditTimes = %v, %v; want t-x only", got, err)
	}
	if _, ok, err := CreditSettledAt(ctx, pool, "t-x"); !ok || err != nil {
		t.Errorf("CreditSettledAt(t-x) = %v, %v", ok, err)
	}
	if _, ok, err := CreditSettledAt(ctx, pool, "t-none"); ok || err != nil {
		t.Errorf("CreditSettledAt(t-none) = %v, %v; want not found", ok, err)
	}
}

// Claims are leased: another relay gets nothing until the lease runs out, and then takes the
// row over. Deferring gives the lease back and makes the row due later; only the lease holder can
// defer, and a settled row is claimed no more and is cleared by upkeep.
func TestOwedCreditLeases(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)
	transferOutcome(t, pool, debitTo("a", 10, there), Applied)
	transferOutcome(t, pool, debitTo("b", 11, there), Applied)

	claimed := claim(t, pool, "relay-1", time.Hour)
	if len(claimed) != 2 || claimed[0].TakenOver || claimed[0].Attempts != 1 || claimed[0].Dst != 2 || claimed[0].Currency != "EUR" {
		t.Fatalf("first claim: %+v, want both credits, attempt 1, not taken over", claimed)
	}
	if again := claim(t, pool, "relay-2", time.Hour); len(again) != 0 {
		t.Fatalf("a leased credit was claimed by another relay: %+v", again)
	}

	// relay-2 cannot defer what relay-1 holds; relay-1 can.
	b := Backoff{Base: time.Hour, Max: 2 * time.Hour}
	if err := DeferCredits(ctx, pool, "relay-2", []string{"t-a"}, "nope", b); err != nil {
		t.Fatal(err)
	}
	if err := DeferCredits(ctx, pool, "relay-1", []string{"t-a"}, "shard d1 down: password=hunter2", b); err != nil {
		t.Fatal(err)
	}
	var lastErr string
	var wait time.Duration
	if err := pool.QueryRow(ctx, `SELECT last_error, next_attempt_at - now() FROM shardgate_credit_outbox WHERE transfer_id = 't-a'`).Scan(&lastErr, &wait); err != nil {
		t.Fatal(err)
	}
	if lastErr == "nope" || wait < 30*time.Minute || wait > 90*time.Minute {
		t.Errorf("deferred row: last_error %q, due in %s; want relay-1's reason and about an hour (jittered)", lastErr, wait)
	}

	// t-b's lease runs out: relay-2 takes it over. t-a is not due yet.
	mustExec(t, pool, "UPDATE shardgate_credit_outbox SET lease_until = now() - interval '1 second' WHERE transfer_id = 't-b'")
	taken := claim(t, pool, "relay-2", time.Hour)
	if len(taken) != 1 || taken[0].TransferID != "t-b" || !taken[0].TakenOver || taken[0].Attempts != 2 {
		t.Fatalf("after t-b's lease ran out: %+v, want t-b taken over at attempt 2", taken)
	}

	if err := SettleCredits(ctx, pool, map[string]time.Time{"t-b": time.Now()}); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, "UPDATE shardgate_credit_outbox SET next_attempt_at = now() WHERE transfer_id = 't-a'")
	if got := claim(t, pool, "relay-3", time.Hour); len(got) != 1 || got[0].TransferID != "t-a" {
		t.Errorf("claim after settling t-b: %+v, want t-a alone", got)
	}
	if n, err := ClearSettled(ctx, pool, time.Hour); err != nil || n != 0 {
		t.Errorf("ClearSettled(1h) = %d, %v; want 0: t-b settled just now", n, err)
	}
	if n, err := ClearSettled(ctx, pool, 0); err != nil || n != 1 {
		t.Errorf("ClearSettled(0) = %d, %v; want t-b", n, err)
	}
}

func claim(t *testing.T, pool *pgxpool.Pool, owner string, lease time.Duration) []OwedCredit {
	t.Helper()
	c, err := ClaimCredits(context.Background(), pool, owner, 10, lease)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Owed credits of a range the shard no longer holds actively are not its to deliver.
func TestClaimOnlyActiveRanges(t *testing.T) {
	pool := halfShard(t)
	transferOutcome(t, pool, debitTo("a", 10, there), Applied)
	mustExec(t, pool, "UPDATE shardgate_owned_range SET active = false")
	if got := claim(t, pool, "relay-1", time.Hour); len(got) != 0 {
		t.Errorf("claimed %d credits of an inactive range", len(got))
	}
	if owed, _, err := OwedStats(context.Background(), pool); err != nil || owed != 0 {
		t.Errorf("OwedStats counts %d credits of an inactive range (%v)", owed, err)
	}
}

// The transfer functions of earlier releases are wrappers over shardgate_apply_batch: a debit
// through them records its owed credit too.
func TestEarlierFunctionsOweTheCredit(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)
	for _, q := range []string{
		`SELECT outcome FROM shardgate_transfer('c:transfer', 'k13', 'h', $1, 't-13', 'c', 1, 2, 5, 'EUR', NULL, '{"status":201}', interval '720 hours')`,
		`SELECT outcome FROM shardgate_transfer('c:transfer', 'k12', 'h', $1, 't-12', 'c', 1, 2, 5, 'EUR', NULL, '{"status":201}')`,
		`SELECT outcome FROM shardgate_transfer_batch(ARRAY['c:transfer'], ARRAY['kb'], ARRAY['h'], ARRAY[$1::bigint], ARRAY['t-b'],
			ARRAY['c'], ARRAY[1::bigint], ARRAY[2::bigint], ARRAY[5::bigint], ARRAY['EUR'], ARRAY[NULL::text], ARRAY['{"status":201}'::jsonb], interval '720 hours')`,
	} {
		var outcome string
		if err := pool.QueryRow(ctx, q, signedKeyspace(here)).Scan(&outcome); err != nil || outcome != "applied" {
			t.Fatalf("%s: %s %v", q, outcome, err)
		}
	}
	for _, id := range []string{"t-13", "t-12", "t-b"} {
		if d, c, owed := legs(t, pool, id); d != 1 || c != 0 || !owed {
			t.Errorf("%s: %d debits, %d credits, owed %v; want 1, 0, owed", id, d, c, owed)
		}
	}
}

// A balance is credits minus debits per currency on the account's shard, with what its debits
// still owe shown apart; a shard that does not own the account says so.
func TestBalance(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)
	transferOutcome(t, pool, debitTo("local", 10, here), Applied)   // 1 → 2 here
	transferOutcome(t, pool, debitTo("remote", 30, there), Applied) // 1 → 2 elsewhere: owed
	usd := debitTo("usd", 7, there)
	usd.Currency = "USD"
	transferOutcome(t, pool, usd, Applied)
	// Account 1's rows all carry keyspace id 42 (testTransfer's): its balance is read there.
	got, version, err := Balance(ctx, pool, 1, here)
	if err != nil {
		t.Fatal(err)
	}
	want := []CurrencyBalance{{Currency: "EUR", Debits: 40, PendingOut: 30}, {Currency: "USD", Debits: 7, PendingOut: 7}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || version != 3 {
		t.Errorf("Balance(1) = %+v (version %d), want %+v (version 3)", got, version, want)
	}
	// Account 2's credit here has keyspace id 42 as well (debitTo's destination).
	if got, _, err := Balance(ctx, pool, 2, here); err != nil || len(got) != 1 || got[0] != (CurrencyBalance{Currency: "EUR", Credits: 10}) {
		t.Errorf("Balance(2) = %+v, %v; want the one local credit", got, err)
	}
	if _, _, err := Balance(ctx, pool, 1, there); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Balance on a shard that does not own the account: %v, want ErrNotOwned", err)
	}
}

// A router of the previous release may have a debit in flight, in its old function body, while
// migration 0004 runs: it commits after the backfill with no owed row. The sweep upkeep makes
// once the grace has passed finds it, makes its credit owed, and never runs again.
func TestSweepUpgradeWindowOwesInFlightDebits(t *testing.T) {
	ctx := context.Background()
	pool, ms := releaseDB(t, 3) // up to 0003: the previous release
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	var outcome string
	if err := tx.QueryRow(ctx, `SELECT outcome FROM shardgate_transfer('c:transfer', 'k', 'h', $1, 't-inflight', 'c', 1, 2, 5, 'EUR', NULL, '{"status":201}', interval '720 hours')`,
		signedKeyspace(here)).Scan(&outcome); err != nil || outcome != "applied" {
		t.Fatalf("the old release's transfer: %s %v", outcome, err)
	}
	// 0004 runs while the old transfer is in flight (later migrations may need it to have ended:
	// 0006 takes idempotency_record's table lock for its CHECK).
	mustExec(t, pool, ms[3].SQL)
	mustExec(t, pool, "INSERT INTO shardgate_schema_migrations (version, name) VALUES ($1, $2)", ms[3].Version, ms[3].Name)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if d, c, owed := legs(t, pool, "t-inflight"); d != 1 || c != 0 || owed {
		t.Fatalf("before the sweep: %d debits, %d credits, owed %v; want the debit alone (what the sweep is for)", d, c, owed)
	}
	transferOutcome(t, pool, debitTo("local", 10, here), Applied) // its credit is here: not swept

	if n, ran, err := SweepUpgradeWindow(ctx, pool, time.Hour); err != nil || ran || n != 0 {
		t.Fatalf("sweep within its grace: %d, %v, %v; want nothing yet", n, ran, err)
	}
	if n, ran, err := SweepUpgradeWindow(ctx, pool, 0); err != nil || !ran || n != 1 {
		t.Fatalf("sweep after its grace: %d, ran %v, %v; want the one in-flight debit", n, ran, err)
	}
	if _, _, owed := legs(t, pool, "t-inflight"); !owed {
		t.Error("the in-flight debit's credit is still not owed")
	}
	if _, _, owed := legs(t, pool, "t-local"); owed {
		t.Error("a debit whose credit is on its own shard was made owed")
	}
	mustExec(t, pool, "DELETE FROM shardgate_credit_outbox")
	if n, ran, err := SweepUpgradeWindow(ctx, pool, 0); err != nil || ran || n != 0 {
		t.Errorf("a second sweep: %d, ran %v, %v; want none: it runs once", n, ran, err)
	}
}

// A debit written through a connection with CreditLeaseSettings owes its credit leased to that
// router's relay from the start, through both group functions: no other relay claims it until
// the lease runs out, and then one takes it over. Without the settings the owed credit is due
// at once, unleased.
func TestDebitLeasesItsOwedCreditToItsRouter(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) { debitLeasesItsOwedCredit(t, q) })
	}
}

func debitLeasesItsOwedCredit(t *testing.T, q string) {
	ctx := context.Background()
	pool := halfShard(t)
	cfg := pool.Config()
	for k, v := range CreditLeaseSettings("router-1", 90*time.Second) {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	leasing, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer leasing.Close()

	if _, err := transferGroup(ctx, leasing, []TransferRequest{debitTo("a", 10, there), debitTo("b", 11, there), debitTo("local", 12, here)}, q); err != nil {
		t.Fatal(err)
	}
	if _, err := transferGroup(ctx, pool, []TransferRequest{debitTo("c", 13, there)}, q); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT transfer_id, coalesce(lease_owner, ''), coalesce(extract(epoch FROM lease_until - debited_at), 0), attempts
		FROM shardgate_credit_outbox ORDER BY transfer_id`)
	if err != nil {
		t.Fatal(err)
	}
	type lease struct {
		owner    string
		seconds  float64
		attempts int
	}
	got := map[string]lease{}
	var (
		id string
		l  lease
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &l.owner, &l.seconds, &l.attempts}, func() error { got[id] = l; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]lease{"t-a": {"router-1", 90, 1}, "t-b": {"router-1", 90, 1}, "t-c": {"", 0, 0}}
	if !maps.Equal(got, want) {
		t.Fatalf("owed credits (owner, lease seconds, attempts): %v, want %v (the same-shard debit owes nothing)", got, want)
	}

	if c := claim(t, pool, "relay-2", time.Hour); len(c) != 1 || c[0].TransferID != "t-c" || c[0].TakenOver {
		t.Fatalf("another relay claimed %+v, want t-c alone: t-a and t-b are leased to router-1", c)
	}
	mustExec(t, pool, "UPDATE shardgate_credit_outbox SET lease_until = now() - interval '1 second' WHERE transfer_id = 't-a'")
	if c := claim(t, pool, "relay-2", time.Hour); len(c) != 1 || c[0].TransferID != "t-a" || !c[0].TakenOver || c[0].Attempts != 2 {
		t.Fatalf("after t-a's lease ran out: %+v, want t-a taken over at attempt 2", c)
	}

	if err := SettleDelivered(ctx, pool, []string{"t-b"}); err != nil {
		t.Fatal(err)
	}
	var settled bool
	var owner *string
	if err := pool.QueryRow(ctx, `SELECT settled_at >= debited_at, lease_owner FROM shardgate_credit_outbox WHERE transfer_id = 't-b'`).Scan(&settled, &owner); err != nil {
		t.Fatal(err)
	}
	if !settled || owner != nil {
		t.Errorf("t-b after SettleDelivered: settled after its debit %v, lease owner %v; want settled, no lease", settled, owner)
	}
}

// A settle does not wait for its commit's flush: the setting it turns off is its own
// transaction's alone, and the session keeps synchronous_commit on.
func TestSettleDoesNotWaitForTheFlush(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)
	transferOutcome(t, pool, debitTo("a", 10, there), Applied)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var lazy string
	err = conn.QueryRow(ctx, `WITH `+settleLazily+` SELECT current_setting('synchronous_commit') FROM lazily`).Scan(&lazy)
	if err != nil || lazy != "off" {
		t.Fatalf("inside a settle, synchronous_commit is %q (%v), want off", lazy, err)
	}
	if _, err := conn.Exec(ctx, `WITH `+settleLazily+` UPDATE shardgate_credit_outbox SET settled_at = now() FROM lazily WHERE transfer_id = 't-a'`); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after); err != nil || after != "on" {
		t.Errorf("after a settle the session's synchronous_commit is %q (%v), want on", after, err)
	}
	if _, _, owed := legs(t, pool, "t-a"); !owed {
		t.Error("the owed row is gone")
	}
}
