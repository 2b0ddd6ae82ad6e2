package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/partition"
)

const month = 30 * 24 * time.Hour

// fixedNow is the "now" of tests that never transfer: far from today, so that its partitions
// cannot be confused with those transfers write to.
var fixedNow = time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC)

func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// tables lists the attached partitions of idempotency_record and the plain tables named like
// them, each sorted.
func tables(t *testing.T, pool *pgxpool.Pool) (attached, plain []string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname, c.relispartition FROM pg_class c
		WHERE c.relkind = 'r' AND c.relname LIKE 'idempotency\_record\_%' ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name string
			part bool
		)
		if err := rows.Scan(&name, &part); err != nil {
			t.Fatal(err)
		}
		if part {
			attached = append(attached, name)
		} else {
			plain = append(plain, name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return attached, plain
}

func dailyNames(from time.Time, n int) []string {
	var names []string
	for p, i := partition.At(partition.Daily, from), 0; i < n; p, i = partition.At(partition.Daily, p.To), i+1 {
		names = append(names, p.Name)
	}
	return names
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func mustUpkeep(t *testing.T, pool *pgxpool.Pool, o UpkeepOptions) UpkeepReport {
	t.Helper()
	rep, err := Upkeep(context.Background(), pool, o)
	if err != nil {
		t.Fatalf("upkeep: %v", err)
	}
	if rep.Skipped {
		t.Fatal("upkeep skipped although no other upkeep runs")
	}
	return rep
}

// Upkeep drops exactly the partitions of our scheme whose whole range is older than retention:
// not one a nanosecond younger, not partitions or tables that are not ours.
func TestUpkeepDropsOnlyExpiredPartitions(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	// Feb 8 .. Feb 15; with a month of retention from Mar 15 00:00 the cutoff is Feb 13 00:00.
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Date(2026, 2, 8, 12, 0, 0, 0, time.UTC), 7); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		// not named by our scheme
		`CREATE TABLE idempotency_record_archive PARTITION OF idempotency_record FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')`,
		// named by our scheme, but its bounds are not that day
		`CREATE TABLE idempotency_record_2000_02_01 PARTITION OF idempotency_record FOR VALUES FROM ('2000-02-01') TO ('2000-02-03')`,
		// named and bounded by our scheme, but in another schema
		`CREATE SCHEMA archive`,
		`CREATE TABLE archive.idempotency_record_2000_07_01 PARTITION OF idempotency_record FOR VALUES FROM ('2000-07-01') TO ('2000-07-02')`,
		// no finite lower bound
		`CREATE TABLE idempotency_record_old PARTITION OF idempotency_record FOR VALUES FROM (MINVALUE) TO ('1999-01-01')`,
		// monthly, from before partition_interval was changed to daily: ours, and expired
		`CREATE TABLE idempotency_record_2000_03 PARTITION OF idempotency_record FOR VALUES FROM ('2000-03-01') TO ('2000-04-01')`,
		// a plain table with an expired name: not ours to drop
		`CREATE TABLE idempotency_record_2000_05_01 (LIKE idempotency_record)`,
		// left behind by a pass whose DROP was interrupted: dropped
		`CREATE TABLE idempotency_record_2000_06_01 (LIKE idempotency_record)`,
		`COMMENT ON TABLE idempotency_record_2000_06_01 IS '` + dropMarker + `'`,
		// marked, but its name says it is younger than retention: kept
		`CREATE TABLE idempotency_record_2026_03_01 (LIKE idempotency_record)`,
		`COMMENT ON TABLE idempotency_record_2026_03_01 IS '` + dropMarker + `'`,
	} {
		mustExec(t, pool, sql)
	}

	// One nanosecond before Feb 12's partition is wholly expired.
	rep := mustUpkeep(t, pool, UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: month, Now: fixedNow.Add(-time.Nanosecond)})
	wantDropped := []string{"idempotency_record_2000_03", "idempotency_record_2000_06_01",
		"idempotency_record_2026_02_08", "idempotency_record_2026_02_09", "idempotency_record_2026_02_10", "idempotency_record_2026_02_11"}
	if got := sorted(rep.Dropped); !slices.Equal(got, wantDropped) {
		t.Errorf("dropped %v, want %v", got, wantDropped)
	}
	if want := dailyNames(fixedNow.Add(-time.Nanosecond), 3); !slices.Equal(rep.Created, want) {
		t.Errorf("created %v, want %v", rep.Created, want)
	}

	// At exactly the cutoff, Feb 12's partition ends at Now - Retention: expired.
	rep = mustUpkeep(t, pool, UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: month, Now: fixedNow})
	if want := []string{"idempotency_record_2026_02_12"}; !slices.Equal(rep.Dropped, want) {
		t.Errorf("at the cutoff: dropped %v, want %v", rep.Dropped, want)
	}
	if want := []string{"idempotency_record_2026_03_17"}; !slices.Equal(rep.Created, want) {
		t.Errorf("at the cutoff: created %v, want %v", rep.Created, want)
	}

	attached, plain := tables(t, pool)
	wantAttached := []string{"idempotency_record_2000_02_01", "idempotency_record_2000_07_01", "idempotency_record_2026_02_13", "idempotency_record_2026_02_14",
		"idempotency_record_2026_02_15", "idempotency_record_2026_03_14", "idempotency_record_2026_03_15",
		"idempotency_record_2026_03_16", "idempotency_record_2026_03_17", "idempotency_record_archive", "idempotency_record_old"}
	if !slices.Equal(attached, wantAttached) {
		t.Errorf("attached %v, want %v", attached, wantAttached)
	}
	if want := []string{"idempotency_record_2000_05_01", "idempotency_record_2026_03_01"}; !slices.Equal(plain, want) {
		t.Errorf("plain tables %v, want %v", plain, want)
	}

	// The report's state is the attached partitions with bounds, oldest first.
	var names []string
	for _, p := range rep.State.Partitions {
		names = append(names, p.Name)
	}
	if want := []string{"idempotency_record_archive", "idempotency_record_2000_02_01", "idempotency_record_2000_07_01",
		"idempotency_record_2026_02_13", "idempotency_record_2026_02_14", "idempotency_record_2026_02_15",
		"idempotency_record_2026_03_14", "idempotency_record_2026_03_15", "idempotency_record_2026_03_16",
		"idempotency_record_2026_03_17"}; !slices.Equal(names, want) {
		t.Errorf("state partitions %v", names)
	}
	if rep.State.Bytes <= 0 || rep.State.ReadAt.IsZero() {
		t.Errorf("state %+v: want a size and a read time", rep.State)
	}
}

// interruptDetach leaves partition name "detach pending", as a DETACH ... CONCURRENTLY does
// when it is cancelled while waiting for transactions that use idempotency_record. It returns
// the transaction it waited for, still open; the caller ends it.
func interruptDetach(t *testing.T, pool *pgxpool.Pool, name string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blocker.Rollback(ctx) }) //nolint:errcheck // a no-op once the caller ended it
	if _, err := blocker.Exec(ctx, "SELECT count(*) FROM idempotency_record"); err != nil {
		t.Fatal(err)
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.Hijack()
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET lock_timeout = '100ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("ALTER TABLE idempotency_record DETACH PARTITION %s CONCURRENTLY", name))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("DETACH CONCURRENTLY of %s: %v, want a lock timeout", name, err)
	}
	if !detachPending(t, pool, name) {
		t.Fatalf("%s is not pending detach", name)
	}
	return blocker
}

func detachPending(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var pending bool
	err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_inherits
		WHERE inhrelid = to_regclass($1) AND inhparent = 'idempotency_record'::regclass AND inhdetachpending)`, name).Scan(&pending)
	if err != nil {
		t.Fatal(err)
	}
	return pending
}

// A partition left "detach pending" by an interrupted DETACH CONCURRENTLY is finalized: dropped
// when expired, attached again when it holds now. One that is neither is left alone, loudly.
func TestUpkeepFinishesInterruptedDetach(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 1, Retention: month, Now: fixedNow, LockTimeout: 200 * time.Millisecond}
	// For the passes that must succeed: a short lock timeout could expire on a lock that
	// autovacuum holds for a moment.
	patient := opts
	patient.LockTimeout = 10 * time.Second
	expired := partition.At(partition.Daily, fixedNow.Add(-2*month)).Name
	young := partition.At(partition.Daily, fixedNow.Add(-5*24*time.Hour)).Name
	current := partition.At(partition.Daily, fixedNow).Name
	for _, at := range []time.Time{fixedNow.Add(-2 * month), fixedNow.Add(-5 * 24 * time.Hour)} {
		if _, err := EnsurePartitions(ctx, pool, partition.Daily, at, 0); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("expired, while a transaction still uses it", func(t *testing.T) {
		blocker := interruptDetach(t, pool, expired)
		rep, err := Upkeep(ctx, pool, opts)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			t.Fatalf("upkeep while a transaction holds the table: %v, want a lock timeout", err)
		}
		if want := dailyNames(fixedNow, 2); !slices.Equal(rep.Created, want) {
			t.Errorf("created %v before the stuck detach, want %v", rep.Created, want)
		}
		if !detachPending(t, pool, expired) {
			t.Errorf("%s: no longer pending, yet not dropped", expired)
		}
		if err := blocker.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		rep = mustUpkeep(t, pool, patient)
		if want := []string{expired}; !slices.Equal(rep.Dropped, want) {
			t.Errorf("dropped %v, want %v", rep.Dropped, want)
		}
	})

	t.Run("holding now", func(t *testing.T) {
		if err := interruptDetach(t, pool, current).Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		rep := mustUpkeep(t, pool, patient)
		if want := []string{current}; !slices.Equal(rep.Reattached, want) || len(rep.Created) != 0 || len(rep.Dropped) != 0 {
			t.Errorf("report %+v, want %s attached again and nothing else", rep, current)
		}
		if detachPending(t, pool, current) {
			t.Errorf("%s still pending", current)
		}
	})

	t.Run("younger than retention", func(t *testing.T) {
		if err := interruptDetach(t, pool, young).Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := Upkeep(ctx, pool, patient)
		if err == nil || !strings.Contains(err.Error(), "pending detach") {
			t.Fatalf("upkeep: %v, want an error about the pending detach", err)
		}
		if !detachPending(t, pool, young) {
			t.Errorf("%s was touched", young)
		}
	})

	attached, plain := tables(t, pool)
	if want := slices.Concat([]string{young}, dailyNames(fixedNow, 2)); !slices.Equal(attached, want) || len(plain) != 0 {
		t.Errorf("attached %v, plain %v; want attached %v", attached, plain, want)
	}
}

// testTransfer is a transfer request for key; amount varies the request hash.
func testTransfer(key string, amount int64) TransferRequest {
	return TransferRequest{
		Scope: "client-a:transfer", Key: key, RequestHash: fmt.Sprintf("hash-%d", amount),
		KeyspaceID: 42, TransferID: "t-" + key, Client: "client-a",
		Src: 1, Dst: 2, Amount: amount, Currency: "EUR", Retention: 720 * time.Hour,
		Response: Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Sprintf(`{"key":%q}`, key)},
	}
}

// counts returns the debits and idempotency records of key.
func counts(t *testing.T, pool *pgxpool.Pool, key string) (ledger, records int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM ledger_entries WHERE transfer_id = 't-' || $1 AND kind = 'transfer_out'),
		(SELECT count(*) FROM idempotency_record WHERE key = $1)`, key).Scan(&ledger, &records)
	if err != nil {
		t.Fatal(err)
	}
	return ledger, records
}

func partitionOf(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(context.Background(), "SELECT tableoid::regclass::text FROM idempotency_record WHERE key = $1", key).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func transferOutcome(t *testing.T, pool *pgxpool.Pool, r TransferRequest, want Outcome) TransferResult {
	t.Helper()
	res, err := Transfer(context.Background(), pool, r)
	if err != nil || res.Outcome != want {
		t.Fatalf("transfer %s: %v %v, want %s", r.Key, res.Outcome, err, want)
	}
	return res
}

// Without a partition for now, a transfer fails closed (ErrNoPartition, nothing stored, the debit
// rolled back), and the next upkeep makes it apply. A partition that was detached by hand is
// attached again, so the keys in it replay again; one that was dropped is created.
func TestMissingPartitionFailsClosed(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 1, Retention: month}
	mustUpkeep(t, pool, opts)
	first := testTransfer("first", 10)
	transferOutcome(t, pool, first, Applied)
	current := partitionOf(t, pool, first.Key)

	for _, tc := range []struct {
		name, sql string
		created   bool
	}{
		{"detached", "ALTER TABLE idempotency_record DETACH PARTITION " + current, false},
		{"dropped", "DROP TABLE " + current, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustExec(t, pool, tc.sql)
			r := testTransfer("after-"+tc.name, 20)
			if _, err := Transfer(ctx, pool, r); !errors.Is(err, ErrNoPartition) {
				t.Fatalf("transfer without a partition: %v, want ErrNoPartition", err)
			}
			if l, n := counts(t, pool, r.Key); l != 0 || n != 0 {
				t.Fatalf("failed transfer stored %d ledger rows and %d records", l, n)
			}
			if tc.name == "detached" {
				// Meanwhile the first key's record is out of sight: its retry is refused by the
				// ledger, never applied twice, and not called expired (its debit is young).
				transferOutcome(t, pool, first, RecordMissing)
			}
			rep := mustUpkeep(t, pool, opts)
			got := rep.Reattached
			if tc.created {
				got = rep.Created
			}
			if want := []string{current}; !slices.Equal(got, want) {
				t.Errorf("upkeep report %+v, want %s", rep, current)
			}
			transferOutcome(t, pool, r, Applied)
			if l, n := counts(t, pool, r.Key); l != 1 || n != 1 {
				t.Errorf("%d ledger rows and %d records, want 1 and 1", l, n)
			}
		})
		if t.Failed() {
			return
		}
		if tc.name == "detached" {
			// Attached again with its rows: the first key replays, not "expired".
			transferOutcome(t, pool, first, Replayed)
		}
	}
	// Its record went with the dropped partition; the ledger still refuses a second debit, and
	// the debit is younger than retention: an inconsistency, not an expiry.
	transferOutcome(t, pool, first, RecordMissing)
	if l, _ := counts(t, pool, first.Key); l != 1 {
		t.Errorf("%d ledger rows for the first key, want 1", l)
	}
}

// A DEFAULT partition would swallow the rows of a missing partition; upkeep refuses to work
// around one.
func TestUpkeepRefusesDefaultPartition(t *testing.T) {
	pool := scratchDB(t)
	mustExec(t, pool, "CREATE TABLE idempotency_record_default PARTITION OF idempotency_record DEFAULT")
	_, err := Upkeep(context.Background(), pool, UpkeepOptions{Interval: partition.Daily, Ahead: 1, Retention: month, Now: fixedNow})
	if err == nil || !strings.Contains(err.Error(), "DEFAULT partition") {
		t.Fatalf("upkeep: %v, want a refusal naming the DEFAULT partition", err)
	}
	if attached, _ := tables(t, pool); !slices.Equal(attached, []string{"idempotency_record_default"}) {
		t.Errorf("upkeep changed partitions: %v", attached)
	}
}

// A record at 23:59:59.9 yesterday, in yesterday's partition, still blocks a second apply of
// its key today, with retries arriving at once: every one replays.
func TestRetryAcrossPartitionBoundaryReplays(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	mustUpkeep(t, pool, UpkeepOptions{Interval: partition.Daily, Ahead: 1, Retention: month})
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now().Add(-24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	r := testTransfer("boundary", 30)
	first := transferOutcome(t, pool, r, Applied)
	var at time.Time
	if err := pool.QueryRow(ctx, `UPDATE idempotency_record SET created_at = date_trunc('day', now(), 'UTC') - interval '100 milliseconds'
		WHERE key = $1 RETURNING created_at`, r.Key).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if got, want := partitionOf(t, pool, r.Key), partition.At(partition.Daily, at).Name; got != want || at.UTC().Format("15:04:05.000") != "23:59:59.900" {
		t.Fatalf("record at %v in %s, want 23:59:59.900 in %s", at.UTC(), got, want)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			res, err := Transfer(ctx, pool, r)
			switch {
			case err != nil:
				errs <- err
			case res.Outcome != Replayed:
				errs <- fmt.Errorf("outcome %s, want replayed", res.Outcome)
			case res.Response.Body != first.Response.Body:
				errs <- fmt.Errorf("replayed %q, want %q", res.Response.Body, first.Response.Body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	transferOutcome(t, pool, r, Replayed)
	transferOutcome(t, pool, testTransfer(r.Key, 31), KeyReused)
	if l, n := counts(t, pool, r.Key); l != 1 || n != 1 {
		t.Errorf("%d ledger rows and %d records, want 1 and 1", l, n)
	}
}

// Upkeeps running at once, with an EnsurePartitions beside them as ApplyMap runs it, all
// succeed or skip, never wait for each other into a deadlock, and drop each expired partition
// exactly once.
func TestConcurrentUpkeepsAgree(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 3, Retention: month, Now: fixedNow}
	skips := 0
	for round := range 5 {
		seedFrom := time.Date(2001, 1, 1+5*round, 0, 0, 0, 0, time.UTC)
		if _, err := EnsurePartitions(ctx, pool, partition.Daily, seedFrom, 4); err != nil {
			t.Fatal(err)
		}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			reports = make([]UpkeepReport, 2)
			errs    = make([]error, 3)
		)
		for i := range reports {
			wg.Go(func() {
				<-start
				reports[i], errs[i] = Upkeep(ctx, pool, opts)
			})
		}
		wg.Go(func() {
			<-start
			_, errs[2] = EnsurePartitions(ctx, pool, partition.Daily, fixedNow, 3)
		})
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var dropped []string
		for _, rep := range reports {
			if rep.Skipped {
				skips++
			}
			dropped = append(dropped, rep.Dropped...)
		}
		// Both may have skipped, had EnsurePartitions held the lock just then: a later pass
		// finishes the work.
		dropped = append(dropped, mustUpkeep(t, pool, opts).Dropped...)
		if got, want := sorted(dropped), dailyNames(seedFrom, 5); !slices.Equal(got, want) {
			t.Errorf("round %d: dropped %v together, want each of %v once", round, got, want)
		}
	}
	t.Logf("%d of %d upkeeps skipped because another held the lock", skips, 10)
	if attached, plain := tables(t, pool); !slices.Equal(attached, dailyNames(fixedNow, 4)) || len(plain) != 0 {
		t.Errorf("attached %v, plain %v; want %v", attached, plain, dailyNames(fixedNow, 4))
	}
}

// Transfers keep succeeding, and keep replaying, while upkeep creates and drops partitions
// underneath them over and over.
func TestUpkeepDuringTransfers(t *testing.T) {
	pool := scratchDB(t)
	ctx := context.Background()
	mustUpkeep(t, pool, UpkeepOptions{Interval: partition.Daily, Ahead: 1, Retention: month})
	seedFrom := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	const seeded = 40
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, seedFrom, seeded-1); err != nil {
		t.Fatal(err)
	}

	var (
		stop     atomic.Bool
		applied  atomic.Int64
		replayed atomic.Int64
		workers  sync.WaitGroup
		failures = make(chan error, 100)
	)
	fail := func(err error) {
		select {
		case failures <- err:
		default:
		}
	}
	for w := range 8 {
		workers.Go(func() {
			var keys []string
			for i := 0; !stop.Load(); i++ {
				r := testTransfer(fmt.Sprintf("w%d-%d", w, i), 5)
				want := Applied
				if i%4 == 3 && len(keys) > 0 { // a retry of an earlier key
					r, want = testTransfer(keys[len(keys)/2], 5), Replayed
				}
				res, err := Transfer(ctx, pool, r)
				if err != nil {
					fail(fmt.Errorf("transfer %s failed during upkeep: %w", r.Key, err))
					continue
				}
				if res.Outcome != want {
					fail(fmt.Errorf("transfer %s: %s, want %s", r.Key, res.Outcome, want))
					continue
				}
				if want == Applied {
					keys = append(keys, r.Key)
					applied.Add(1)
				} else {
					replayed.Add(1)
				}
			}
		})
	}

	var created, dropped int
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline) || i < 3; i++ {
		// Each pass drops one more seeded partition and keeps one more future partition ready.
		cutoff := seedFrom.AddDate(0, 0, min(i+1, seeded))
		rep, err := Upkeep(ctx, pool, UpkeepOptions{Interval: partition.Daily, Ahead: 1 + min(i, 30), Retention: time.Since(cutoff)})
		if err != nil {
			t.Errorf("upkeep pass %d: %v", i, err)
			break
		}
		created += len(rep.Created)
		dropped += len(rep.Dropped)
	}
	stop.Store(true)
	workers.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if created < 2 || dropped < 2 {
		t.Errorf("upkeep created %d and dropped %d partitions during the run; want several of each", created, dropped)
	}
	var ledger int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out'").Scan(&ledger); err != nil {
		t.Fatal(err)
	}
	if ledger != applied.Load() || applied.Load() == 0 || replayed.Load() == 0 {
		t.Errorf("%d ledger rows for %d applied transfers (%d replays)", ledger, applied.Load(), replayed.Load())
	}
	t.Logf("%d applied, %d replayed; upkeep created %d and dropped %d partitions", applied.Load(), replayed.Load(), created, dropped)
}

func TestUpkeepOptionsValidate(t *testing.T) {
	ok := UpkeepOptions{Interval: partition.Daily, Ahead: 3, Retention: month}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]UpkeepOptions{
		"no interval":        {Ahead: 3, Retention: month},
		"negative ahead":     {Interval: partition.Daily, Ahead: -1, Retention: month},
		"zero retention":     {Interval: partition.Monthly, Ahead: 1},
		"negative retention": {Interval: partition.Daily, Ahead: 1, Retention: -time.Hour},
		"negative timeout":   {Interval: partition.Daily, Ahead: 1, Retention: month, LockTimeout: -time.Second},
	} {
		if err := o.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
