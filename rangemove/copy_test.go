package rangemove

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardgate/shardgate/idem"
)

// The copy passes rows as binary COPY data, never decoding them: every value arrives on the new
// owner as it was on the old one, non-ASCII text, quotes, JSON and NULLs included, in batches
// long enough that the next one is read while one is written.
func TestCopyKeepsEveryValue(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	ctx := context.Background()
	keys := []string{"clé ✓ \"quoted\" \\ back", "ключ\ttab", "plain"}
	for i, key := range keys {
		req := benchTransfer(i, true, i != 1)
		req.Key, req.TransferID = key, "t-"+key
		req.Reference = "Grüße ✓ \"ref\" " + key
		req.Response.Body = `{"key":"` + key + `","note":"ünïcödé"}`
		if res, err := idem.Transfer(ctx, c.pool("sa"), req); err != nil || res.Outcome != idem.Applied {
			t.Fatalf("transfer %q: %v %v", key, res.Outcome, err)
		}
	}
	for i := range 2*rowBatch + 7 { // more than two batches of ledger rows
		if res, err := idem.Transfer(ctx, c.pool("sa"), benchTransfer(100+i, true, i%3 == 0)); err != nil || res.Outcome != idem.Applied {
			t.Fatalf("transfer %d: %v %v", i, res.Outcome, err)
		}
	}
	// Every row of the range as text, ledger rows without the id each shard numbers itself.
	rows := `SELECT x FROM (
		SELECT format('%s|%s|%s|%s|%s|%s|%s', key, scope, request_hash, keyspace_id, response, state, created_at) FROM idempotency_record WHERE ` + inRange + `
		UNION ALL SELECT format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client, created_at) FROM ledger_entries WHERE ` + inRange + `
		UNION ALL SELECT o::text FROM shardgate_credit_outbox o WHERE ` + inRange + `) r(x) ORDER BY x`
	lo, hi := idem.Bounds(mustRange(t, "40-80"))
	before := c.texts("sa", rows, lo, hi)
	c.mustApply(c.mapOf(2, "sa=-40 sb=40-"))
	after := c.texts("sb", rows, lo, hi)
	if len(before) < 4*rowBatch || !slices.Equal(before, after) {
		t.Fatalf("%d rows of 40-80 on sa before the move, %d on sb after, or they differ", len(before), len(after))
	}
}

// texts returns the first column of query's rows on shard.
func (c *cluster) texts(shard, query string, args ...any) []string {
	c.t.Helper()
	rows, err := c.pool(shard).Query(context.Background(), query, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}
