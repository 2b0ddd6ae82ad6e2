package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"
)

// backdateAll makes every row of the transfers, ledger and owed, older by d on every shard.
func (b *bank) backdateAll(d time.Duration, ids ...string) {
	b.t.Helper()
	for name := range b.pools {
		b.exec(name, "UPDATE ledger_entries SET created_at = created_at - $1::interval WHERE transfer_id = ANY($2)", d, ids)
		b.exec(name, "UPDATE shardgate_credit_outbox SET debited_at = debited_at - $1::interval WHERE transfer_id = ANY($2)", d, ids)
	}
}

// A window checks only the transfers debited in it: older damage is the whole-history check's.
// A credit in the window whose debit lies before it pairs with that debit, and is no credit
// without debit; a credit read from just before the window (for shards whose clocks differ)
// whose debit is older still is not the window's, and is not counted.
func TestWindow(t *testing.T) {
	b := newBank(t)
	a1, b1, c1 := account(b.m, "sa", 1), account(b.m, "sb", 1), account(b.m, "sc", 1)
	b.pay("t-old-gone", a1, b1, 10)
	b.pay("t-straddling", b1, c1, 20)
	b.pay("t-recent", c1, a1, 30)
	b.pay("t-before", a1, c1, 40)
	b.deliver()
	b.backdateAll(65*time.Minute, "t-before")
	b.exec("sb", "DELETE FROM ledger_entries WHERE transfer_id = 't-old-gone' AND kind = 'transfer_in'")
	b.backdateAll(3*time.Hour, "t-old-gone")
	b.exec("sb", "UPDATE ledger_entries SET created_at = created_at - interval '2 hours' WHERE transfer_id = 't-straddling'")

	r := b.check(time.Hour)
	if !r.Clean() || r.Debits != 2 || r.Credits != 2 {
		t.Errorf("last hour: %d debits, %d credits, want 2 and 2 (t-recent, and t-straddling's debit read again), clean:\n%s",
			r.Debits, r.Credits, printed(r))
	}
	if out := printed(r); !strings.Contains(out, "transfers debited in the 1h0m0s before") {
		t.Errorf("report does not say its window:\n%s", out)
	}
	whole := b.check(0)
	wantFound(t, whole, map[Kind]int{MissingCredit: 1})
	if ids := listedIDs(whole, MissingCredit); len(ids) != 1 || ids[0] != "t-old-gone" {
		t.Errorf("whole history: missing %v, want t-old-gone", ids)
	}
}

// A windowed check reads through the indexes on the rows' times, not the whole tables.
func TestWindowUsesIndexes(t *testing.T) {
	b := newBank(t)
	ctx := context.Background()
	pool := b.pools["sa"]
	b.exec("sa", `INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, client, created_at)
		SELECT 'bulk-' || i, 0, i, i + 1, 1, 'EUR', CASE WHEN i % 2 = 0 THEN 'transfer_out' ELSE 'transfer_in' END, 'test',
		       now() - (i * interval '5 minutes')
		  FROM generate_series(1, 8000) i`)
	b.exec("sa", `INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, client, debited_at, settled_at)
		SELECT 'bulk-' || i, 0, i, i + 1, 1, 'EUR', 'test', now() - (i * interval '5 minutes'), now()
		  FROM generate_series(1, 8000) i`)
	b.exec("sa", "ANALYZE ledger_entries")
	b.exec("sa", "ANALYZE shardgate_credit_outbox")
	now := time.Now()
	rows, err := pool.Query(ctx, "EXPLAIN "+windowSQL, now, now, now.Add(-time.Hour), now.Add(-time.Hour-creditMargin))
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, index := range []string{"ledger_entries_created_brin", "shardgate_credit_outbox_debited_brin"} {
		if !strings.Contains(plan.String(), index) {
			t.Errorf("the windowed check does not use %s:\n%s", index, plan.String())
		}
	}
	if strings.Contains(plan.String(), "Seq Scan on ledger_entries") || strings.Contains(plan.String(), "Seq Scan on shardgate_credit_outbox") {
		t.Errorf("the windowed check scans a whole table:\n%s", plan.String())
	}
}
