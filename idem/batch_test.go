package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// halfShard is a migrated shard with partitions that owns only "-80", so keyspace ids from
// 0x80... are not its own.
func halfShard(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := migratedDB(t, "")
	low, _ := shardmap.ParseKeyRange("-80")
	if err := ApplyOwnership(context.Background(), pool, Ownership{Shard: "half", MapVersion: 3, Ranges: []shardmap.KeyRange{low}}, Grant); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsurePartitions(context.Background(), pool, partition.Daily, time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	return pool
}

// One group mixes a new key, a replay, a request in flight elsewhere, a reused key, an expired
// key, a key of a range the shard does not own, and two attempts of one key (same and other
// request). Each gets the answer a lone attempt would get, and only the new keys are written.
func TestTransferBatchItemsKeepTheirOwnOutcomes(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) { itemsKeepTheirOwnOutcomes(t, q) })
	}
}

// itemsKeepTheirOwnOutcomes is TestTransferBatchItemsKeepTheirOwnOutcomes through the group
// function of q.
func itemsKeepTheirOwnOutcomes(t *testing.T, q string) {
	ctx := context.Background()
	pool := halfShard(t)
	done := testTransfer("done", 10)
	transferOutcome(t, pool, done, Applied)
	old := testTransfer("old", 10)
	transferOutcome(t, pool, old, Applied)
	mustExec(t, pool, "DELETE FROM idempotency_record WHERE key = 'old'")
	mustExec(t, pool, "UPDATE ledger_entries SET created_at = now() - interval '800 hours' WHERE transfer_id = 't-old'")

	// Another transaction holds the request lock of "busy": its first attempt is in flight.
	busy := testTransfer("busy", 10)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only holds the lock
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || E'\\n' || $2 || E'\\n' || $3, $4))",
		busy.Scope, busy.Key, busy.RequestHash, RequestLockSeed); err != nil {
		t.Fatal(err)
	}
	foreign := testTransfer("foreign", 10)
	foreign.KeyspaceID = 0x9000000000000000
	twice := testTransfer("twice", 10)
	// A key first attempted for an account of another shard, then for one of this shard: the
	// first attempt is not the second's predecessor here.
	elsewhere := testTransfer("moved", 10)
	elsewhere.KeyspaceID = 0x9000000000000000
	group := []TransferRequest{
		testTransfer("new", 10), done, busy, testTransfer("done", 99), old, foreign,
		twice, twice, testTransfer("twice", 99), testTransfer("new-2", 10),
		elsewhere, testTransfer("moved", 10), done, testTransfer("moved", 10),
	}
	want := []Outcome{Applied, Replayed, InProgress, KeyReused, Expired, NotOwner, Applied, InProgress, KeyReused, Applied,
		NotOwner, Applied, Replayed, InProgress}
	res, err := transferGroup(ctx, pool, group, q)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("item %d (%s): %s, want %s", i, group[i].Key, r.Outcome, want[i])
		}
	}
	if res[1].Response.Body != done.Response.Body || res[5].ShardMapVersion != 3 || res[0].Response.Status != 201 {
		t.Errorf("replay %+v, not-owner version %d, applied %+v", res[1].Response, res[5].ShardMapVersion, res[0].Response)
	}
	if res[12].Response.Body != done.Response.Body {
		t.Errorf("a second replay of one key in a group: %+v", res[12].Response)
	}
	for key, wantRows := range map[string]int{"new": 1, "new-2": 1, "twice": 1, "done": 1, "busy": 0, "foreign": 0, "moved": 1} {
		if l, n := counts(t, pool, key); l != wantRows || n != wantRows {
			t.Errorf("%s: %d ledger rows and %d records, want %d of each", key, l, n, wantRows)
		}
	}
	// After the group committed, "twice" replays.
	transferOutcome(t, pool, twice, Replayed)
}

// A group whose statement fails commits nothing, and says so with a PostgreSQL error (so that
// its items can be sent alone): here the partition for now is missing.
func TestTransferBatchFailsWhole(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) { failsWhole(t, q) })
	}
}

func failsWhole(t *testing.T, q string) {
	ctx := context.Background()
	pool := halfShard(t)
	mustExec(t, pool, "DROP TABLE "+partition.At(partition.Daily, time.Now()).Name)
	group := []TransferRequest{testTransfer("a", 1), testTransfer("b", 1)}
	_, err := transferGroup(ctx, pool, group, q)
	var pgErr *pgconn.PgError
	if !errors.Is(err, ErrNoPartition) || !errors.As(err, &pgErr) {
		t.Fatalf("group without a partition: %v, want ErrNoPartition wrapping the PostgreSQL error", err)
	}
	for _, r := range group {
		if l, n := counts(t, pool, r.Key); l != 0 || n != 0 {
			t.Errorf("%s: %d ledger rows and %d records after a failed group", r.Key, l, n)
		}
	}
}

// The guide's verification, batched: many groups, each with 20 attempts per key over several
// keys, run concurrently; every key ends with one ledger row and one record.
func TestTransferBatchConcurrentAttempts(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) { concurrentAttempts(t, q) })
	}
}

func concurrentAttempts(t *testing.T, q string) {
	ctx := context.Background()
	pool := halfShard(t)
	const keys, attempts, groups = 8, 20, 10
	errs := make(chan error, groups)
	for g := range groups {
		go func() {
			var group []TransferRequest
			for a := range attempts / 2 {
				for k := range keys {
					group = append(group, testTransfer(fmt.Sprintf("k%d", (k+a+g)%keys), 10))
				}
			}
			_, err := transferGroup(ctx, pool, group, q)
			errs <- err
		}()
	}
	for range groups {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		if l, n := counts(t, pool, fmt.Sprintf("k%d", k)); l != 1 || n != 1 {
			t.Errorf("k%d: %d ledger rows and %d records, want 1 and 1", k, l, n)
		}
	}
}

// Two different keys under one transfer id in a group (which the router never sends: the id is
// derived from the key) get what they get row by row: the first applies, the second finds the
// leg in the ledger. One leg, one record, one owed credit.
func TestTransferBatchSharedTransferID(t *testing.T) {
	for name, q := range map[string]string{applyRows: rowsSQL, applyBatch: batchSQL} {
		t.Run(name, func(t *testing.T) {
			pool := halfShard(t)
			a, b := testTransfer("a", 10), testTransfer("b", 10)
			a.DstKeyspaceID, b.DstKeyspaceID = 0x9000000000000000, 0x9000000000000000
			b.TransferID = a.TransferID
			res, err := transferGroup(context.Background(), pool, []TransferRequest{a, b}, q)
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Outcome != Applied || res[1].Outcome != RecordMissing {
				t.Errorf("outcomes %s, %s; want applied, record_missing", res[0].Outcome, res[1].Outcome)
			}
			var legs, records, owed int
			if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM idempotency_record),
				(SELECT count(*) FROM shardgate_credit_outbox)`).Scan(&legs, &records, &owed); err != nil {
				t.Fatal(err)
			}
			if legs != 1 || records != 1 || owed != 1 {
				t.Errorf("%d legs, %d records, %d owed credits; want one of each", legs, records, owed)
			}
		})
	}
}

// A group function refuses arrays it cannot read item by item, naming the problem, and writes
// nothing: arrays of different lengths, and a kind that is neither leg (NULL included).
func TestGroupFunctionsRefuseMalformedArrays(t *testing.T) {
	ctx := context.Background()
	pool := halfShard(t)
	good, err := batchArgs([]TransferRequest{testTransfer("a", 1), testTransfer("b", 2)})
	if err != nil {
		t.Fatal(err)
	}
	withKinds := func(kinds []*string) []any { return append([]any{kinds}, good[1:]...) }
	str := func(s string) *string { return &s }
	cases := map[string][]any{
		"a short array":  append(append([]any{}, good[:3]...), append([]any{[]string{"h"}}, good[4:]...)...),
		"an empty array": append(append([]any{}, good[:13]...), []string{}, good[14]),
		"a NULL kind":    withKinds([]*string{str("transfer_out"), nil}),
		"another kind":   withKinds([]*string{str("transfer_out"), str("refund")}),
	}
	for _, fn := range []string{applyRows, applyBatch} {
		for name, args := range cases {
			_, err := pool.Exec(ctx, groupSQL(fn), args...)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, "differ in length, or a kind") {
				t.Errorf("%s with %s: %v, want 22023 naming the arrays' problem", fn, name, err)
			}
		}
	}
	for _, key := range []string{"a", "b"} {
		if l, n := counts(t, pool, key); l != 0 || n != 0 {
			t.Errorf("%s: %d ledger rows and %d records after refused groups", key, l, n)
		}
	}
}
