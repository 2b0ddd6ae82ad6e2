package idem

import (
	"context"
	"testing"
	"time"

	"github.com/shardgate/shardgate/partition"
)

// A debit whose record cannot be found is "expired" only once the debit itself is older than
// retention. Younger, it is RecordMissing, which the router answers with a retryable 503
// instead of a final 422. Nothing is written either way.
func TestExpiredOnlyWhenTheDebitIsOlderThanRetention(t *testing.T) {
	ctx := context.Background()
	pool := scratchDB(t)
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	req := testTransfer("k-missing", 10)
	if res, err := Transfer(ctx, pool, req); err != nil || res.Outcome != Applied {
		t.Fatalf("first attempt: %v %v", res.Outcome, err)
	}
	// The record is gone while the debit is young (TestMissingPartitionFailsClosed detaches
	// its partition): an inconsistency, answered retryably.
	if _, err := pool.Exec(ctx, "DELETE FROM idempotency_record WHERE key = $1", req.Key); err != nil {
		t.Fatal(err)
	}
	if res, err := Transfer(ctx, pool, req); err != nil || res.Outcome != RecordMissing {
		t.Fatalf("retry without the record: %v %v, want %s", res.Outcome, err, RecordMissing)
	}
	// Dropped by retention: the record is gone and the debit is older than retention.
	if _, err := pool.Exec(ctx, "UPDATE ledger_entries SET created_at = now() - $1::interval - interval '1 minute' WHERE transfer_id = $2", req.Retention, req.TransferID); err != nil {
		t.Fatal(err)
	}
	if res, err := Transfer(ctx, pool, req); err != nil || res.Outcome != Expired {
		t.Fatalf("retry after retention: %v %v, want %s", res.Outcome, err, Expired)
	}
	if ledger, records := counts(t, pool, req.Key); ledger != 1 || records != 0 {
		t.Errorf("%d ledger rows and %d records, want 1 and 0", ledger, records)
	}
}
