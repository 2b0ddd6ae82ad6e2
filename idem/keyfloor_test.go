package idem

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shardgate/shardgate/partition"
)

// keyAt returns a UUIDv7 key in canonical form whose embedded time is at, to the millisecond.
func keyAt(at time.Time) string {
	var u uuid.UUID
	rand.Read(u[:]) //nolint:errcheck // crypto/rand.Read never fails
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return u.String()
}

// keyFloor is shardgate_key_floor(key) on pool; nil for a key without one.
func keyFloor(t *testing.T, pool *pgxpool.Pool, key string) *time.Time {
	t.Helper()
	var f *time.Time
	if err := pool.QueryRow(context.Background(), "SELECT shardgate_key_floor($1)", key).Scan(&f); err != nil {
		t.Fatal(err)
	}
	return f
}

// A key's floor is the time a UUIDv7 in canonical form carries (as google/uuid reads it), and
// no other key has one.
func TestKeyFloorIsTheTimeAUUIDv7Carries(t *testing.T) {
	pool := migratedDB(t, "")
	at := time.Date(2026, 3, 14, 15, 9, 26, 535_000_000, time.UTC)
	k := keyAt(at)
	for _, key := range []string{k, strings.ToUpper(k)} {
		if f := keyFloor(t, pool, key); f == nil || !f.Equal(at) {
			t.Errorf("floor of %s: %v, want %v", key, f, at)
		}
	}
	for i := 0; i < 200; i++ {
		u := uuid.Must(uuid.NewV7())
		sec, nsec := u.Time().UnixTime()
		want := time.Unix(sec, nsec).Truncate(time.Millisecond)
		if f := keyFloor(t, pool, u.String()); f == nil || !f.Equal(want) {
			t.Fatalf("floor of %s: %v, want %v", u, f, want)
		}
	}
	notV7 := map[string]string{
		"a UUIDv4":                 uuid.NewString(),
		"variant bits 11":          k[:19] + "c" + k[20:],
		"version 6":                k[:14] + "6" + k[15:],
		"braces":                   "{" + k + "}",
		"a URN":                    "urn:uuid:" + k,
		"no dashes":                strings.ReplaceAll(k, "-", ""),
		"a letter that is not hex": "g" + k[1:],
		"a word":                   "order-1234",
	}
	for what, key := range notV7 {
		if f := keyFloor(t, pool, key); f != nil {
			t.Errorf("%s (%s) has floor %v, want none", what, key, f)
		}
	}
}

// The CHECK spells shardgate_key_floor out (calling it would cost every insert a parse): for
// keys with a floor and without, the CHECK refuses exactly the records dated before the floor.
func TestKeyFloorAndTheRuleAgree(t *testing.T) {
	ctx := context.Background()
	pool := migratedDB(t, "")
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The partitioned table's constraints, on a plain table: any date goes in.
	if _, err := conn.Exec(ctx, "CREATE TEMP TABLE probe (LIKE idempotency_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"); err != nil {
		t.Fatal(err)
	}
	k := keyAt(time.Date(2026, 3, 14, 15, 9, 26, 535_000_000, time.UTC))
	keys := []string{k, strings.ToUpper(k), k[:19] + "c" + k[20:], k[:14] + "6" + k[15:], "{" + k + "}", "g" + k[1:], "order-1234", uuid.NewString()}
	for i := 0; i < 50; i++ {
		keys = append(keys, uuid.Must(uuid.NewV7()).String(), keyAt(time.UnixMilli(int64(i)*1_000_000_007)))
	}
	insert := func(key string, at time.Time) error {
		_, err := conn.Exec(ctx, `INSERT INTO probe (key, scope, request_hash, keyspace_id, response, state, created_at)
			VALUES ($1, 's', 'h', 1, '{}', 'completed', $2)`, key, at)
		return err
	}
	for _, key := range keys {
		f := keyFloor(t, pool, key)
		if f == nil {
			if err := insert(key, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
				t.Errorf("%s has no floor, yet a record dated 2000 is refused: %v", key, err)
			}
			continue
		}
		var pgErr *pgconn.PgError
		if err := insert(key, f.Add(-time.Millisecond)); !errors.As(err, &pgErr) || pgErr.ConstraintName != "idempotency_record_not_before_key_floor" {
			t.Errorf("%s: a record dated a millisecond before its floor %v: %v, want the rule to refuse it", key, *f, err)
		}
		if err := insert(key, *f); err != nil {
			t.Errorf("%s: a record dated at its floor %v is refused: %v", key, *f, err)
		}
	}
}

// The rule is the database's: a record dated before its key's floor is refused whoever writes
// it, and each transfer function dates a record from a client clock ahead of the shard's at its
// key's time, and any other at now().
func TestRecordsAreNeverDatedBeforeTheirKey(t *testing.T) {
	ctx := context.Background()
	pool := scratchDB(t)
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 2); err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(30 * time.Second).Truncate(time.Millisecond)
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
		VALUES ($1, 's', 'h', 1, '{}', 'completed')`, keyAt(ahead))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "idempotency_record_not_before_key_floor" {
		t.Fatalf("a record dated now for a key 30 s ahead: %v, want the floor's CHECK to refuse it", err)
	}

	for _, fn := range []string{applyRows, applyBatch} {
		t.Run(fn, func(t *testing.T) {
			group := []TransferRequest{
				testTransfer(keyAt(ahead), 1),
				testTransfer(keyAt(time.Now().Add(-time.Hour)), 2),
				testTransfer("opaque-"+fn, 3),
				testTransfer(keyAt(ahead.Add(time.Millisecond)), 4),
			}
			before := time.Now()
			res, err := transferGroup(ctx, pool, group, groupSQL(fn))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range group {
				if res[i].Outcome != Applied {
					t.Fatalf("%s: %s, want applied", r.Key, res[i].Outcome)
				}
				var created time.Time
				if err := pool.QueryRow(ctx, "SELECT created_at FROM idempotency_record WHERE key = $1", r.Key).Scan(&created); err != nil {
					t.Fatal(err)
				}
				if f := keyFloor(t, pool, r.Key); f != nil && f.After(before) {
					if !created.Equal(*f) {
						t.Errorf("%s: dated %v, want its key's time %v", r.Key, created, *f)
					}
				} else if created.Before(before.Add(-time.Second)) || created.After(time.Now()) {
					t.Errorf("%s: dated %v, want now (%v)", r.Key, created, before)
				}
			}
			// And each is found again where it was dated.
			res, err = transferGroup(ctx, pool, group, groupSQL(fn))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Outcome != Replayed {
					t.Errorf("again %s: %s, want replayed", group[i].Key, r.Outcome)
				}
			}
		})
	}
}

// Records written before 0006 were never held to the rule: a shard whose clock ran behind its
// clients' dated some before their keys. Each such record, in an old partition, still decides its
// key after the upgrade, through both functions; and once every record on the shard is under the
// rule (unchecked_before in the past), a lookup reads no partition that ends before its key's
// floor: a record there that breaks the rule is not found.
func TestRecordsFromBeforeTheRuleStillDecide(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5) // up to 0005: the previous release
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now().AddDate(0, 0, -5), 7); err != nil {
		t.Fatal(err)
	}
	// Dated three days before its key: in a partition a floor-bounded lookup would skip.
	early := testTransfer(keyAt(time.Now().Add(-time.Hour)), 10)
	if res := transferOutcome(t, pool, early, Applied); res.Outcome != Applied {
		t.Fatal(res.Outcome)
	}
	mustExec(t, pool, "UPDATE idempotency_record SET created_at = now() - interval '3 days' WHERE key = $1", early.Key)
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Whatever a clock did, every record written before the rule lies in a partition attached
	// then: the latest of them ends two days ahead.
	var unchecked time.Time
	if err := pool.QueryRow(ctx, "SELECT unchecked_before FROM shardgate_record_floor").Scan(&unchecked); err != nil {
		t.Fatal(err)
	}
	if latest := partition.At(partition.Daily, time.Now().AddDate(0, 0, 2)); !unchecked.Equal(latest.To) {
		t.Errorf("unchecked_before %v, want the end of the latest partition, %v", unchecked, latest.To)
	}

	assertDecides(t, pool, early, "the record from before the rule")
	reused := early
	reused.RequestHash = "another request"
	if _, records := counts(t, pool, early.Key); records != 1 {
		t.Fatalf("%d records for the key, want 1", records)
	}

	// Retention later: every record left was written under the rule. The rule-breaking one
	// (which no writer can make any more) is now out of every lookup's reach.
	mustExec(t, pool, "UPDATE shardgate_record_floor SET unchecked_before = now() - interval '40 days'")
	fresh := testTransfer(keyAt(time.Now().Add(-2*time.Hour)), 20)
	transferOutcome(t, pool, fresh, Applied)
	for _, fn := range []string{applyRows, applyBatch} {
		res, err := transferGroup(ctx, pool, []TransferRequest{fresh}, groupSQL(fn))
		if err != nil || res[0].Outcome != Replayed {
			t.Errorf("%s, a record under the rule: %v %v, want replayed", fn, res, err)
		}
		res, err = transferGroup(ctx, pool, []TransferRequest{reused}, groupSQL(fn))
		if err != nil || res[0].Outcome == KeyReused || res[0].Outcome == Replayed {
			t.Errorf("%s: %v %v; the lookup still reads the partition three days before the key's floor", fn, res, err)
		}
	}
}

// A record moved here from a shard of an earlier release may be dated before its key: it is
// copied dated at its key's time, so the rule holds here too.
func TestCopiedRecordsAreDatedNoEarlierThanTheirKey(t *testing.T) {
	ctx := context.Background()
	pool := scratchDB(t)
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now().AddDate(0, 0, -2), 3); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	early, onTime := keyAt(at), keyAt(at)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE TEMP TABLE moving_rows ON COMMIT DROP AS SELECT key, scope, request_hash, keyspace_id, response, state, created_at FROM idempotency_record WITH NO DATA"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO moving_rows VALUES
			($1, 's', 'h', 1, '{}', 'completed', now() - interval '1 day'),
			($2, 's', 'h', 1, '{}', 'completed', now())`, early, onTime); err != nil {
			return err
		}
		var inserted, conflicts int64
		if err := tx.QueryRow(ctx, "SELECT inserted, conflicts FROM shardgate_copy_records()").Scan(&inserted, &conflicts); err != nil {
			return err
		}
		if inserted != 2 || conflicts != 0 {
			return fmt.Errorf("copied %d with %d conflicts, want 2 and 0", inserted, conflicts)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var earlyAt, onTimeAt time.Time
	if err := pool.QueryRow(ctx, "SELECT (SELECT created_at FROM idempotency_record WHERE key = $1), (SELECT created_at FROM idempotency_record WHERE key = $2)",
		early, onTime).Scan(&earlyAt, &onTimeAt); err != nil {
		t.Fatal(err)
	}
	if !earlyAt.Equal(at) {
		t.Errorf("a record dated a day before its key was copied dated %v, want its key's time %v", earlyAt, at)
	}
	if !onTimeAt.After(at) {
		t.Errorf("a record dated after its key was copied dated %v, want its own date (after %v)", onTimeAt, at)
	}
}

// 0006 takes idempotency_record's table lock for its CHECK: behind a transfer that stays open, it
// gives up after its lock timeout instead of holding every transfer behind it, changes nothing,
// and applies when run again.
func TestMigrationGivesUpBehindATransferInFlight(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5) // up to 0005: the previous release
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	args, err := batchArgs([]TransferRequest{testTransfer("in-flight", 1)})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, groupSQL(applyRows), args...)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Migrate(ctx, pool)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || !strings.Contains(err.Error(), "0006") {
		t.Fatalf("migrating behind an open transfer: %v, want 0006 to fail on its lock timeout (55P03)", err)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Errorf("gave up after %v, want its 10 s lock timeout", waited)
	}
	var floors bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('shardgate_record_floor') IS NOT NULL").Scan(&floors); err != nil || floors {
		t.Fatalf("after the failed migration, shardgate_record_floor exists: %v %v; want nothing of 0006", floors, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if applied, err := Migrate(ctx, pool); err != nil || len(applied) < 2 || applied[0] != "0006_records_from_key_time" || applied[1] != "0007_early_records" {
		t.Fatalf("run again: %v %v, want 0006 and 0007 applied first", applied, err)
	}
}

// A partition detached on the previous release lacks 0006's CHECK, which ATTACH requires: upkeep
// gives it the CHECK (NOT VALID: its rows predate the rule) and attaches it again, and its keys
// still decide.
func TestPartitionDetachedBeforeTheRuleIsAttachedAgain(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5) // up to 0005: the previous release
	r := testTransfer(keyAt(time.Now().Add(-time.Minute)), 30)
	transferOutcome(t, pool, r, Applied)
	today := partition.At(partition.Daily, time.Now()).Name
	mustExec(t, pool, "ALTER TABLE idempotency_record DETACH PARTITION "+today)
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	created, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 2)
	if err != nil || !slices.Contains(created, today) {
		t.Fatalf("upkeep after the upgrade: %v %v, want %s attached again", created, err, today)
	}
	var valid *bool
	if err := pool.QueryRow(ctx, `SELECT convalidated FROM pg_constraint WHERE conrelid = $1::regclass AND conname = 'idempotency_record_not_before_key_floor'`,
		today).Scan(&valid); err != nil || valid == nil || *valid {
		t.Errorf("%s's copy of the rule: validated %v (%v), want it present and NOT VALID", today, valid, err)
	}
	for _, fn := range []string{applyRows, applyBatch} {
		res, err := transferGroup(ctx, pool, []TransferRequest{r}, groupSQL(fn))
		if err != nil || res[0].Outcome != Replayed {
			t.Errorf("%s, a key in the partition attached again: %v %v, want replayed", fn, res, err)
		}
	}
}

// assertDecides checks that r's record decides its key through both group functions: r is
// replayed, and the same key for another request is refused as reused.
func assertDecides(t *testing.T, pool *pgxpool.Pool, r TransferRequest, what string) {
	t.Helper()
	reused := r
	reused.RequestHash = "another request"
	for _, fn := range []string{applyRows, applyBatch} {
		for _, c := range []struct {
			r    TransferRequest
			want Outcome
		}{{r, Replayed}, {reused, KeyReused}} {
			res, err := transferGroup(context.Background(), pool, []TransferRequest{c.r}, groupSQL(fn))
			if err != nil || res[0].Outcome != c.want {
				t.Errorf("%s, %s, hash %s: %v %v, want %s", what, fn, c.r.RequestHash, res, err, c.want)
			}
		}
	}
}

// recordFloor returns shardgate_record_floor.unchecked_before.
func recordFloor(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var u time.Time
	if err := pool.QueryRow(context.Background(), "SELECT unchecked_before FROM shardgate_record_floor").Scan(&u); err != nil {
		t.Fatal(err)
	}
	return u
}

// earlyBy returns shardgate_record_floor.early_by, to the microsecond.
func earlyBy(t *testing.T, pool *pgxpool.Pool) time.Duration {
	t.Helper()
	var us int64
	if err := pool.QueryRow(context.Background(), "SELECT (extract(epoch FROM early_by) * 1000000)::bigint FROM shardgate_record_floor").Scan(&us); err != nil {
		t.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond
}

// A shard upgraded to 0006 holds partitions from before the rule, which every lookup reads until
// upkeep brings them under it, newest first: it reads how early each dates its records (a client
// clock ran ahead of the shard's), widens early_by to that and lowers unchecked_before past it.
// No record is rewritten, and every one still decides its key through lookups that skip the
// partitions before its floor less early_by. The next pass has nothing left to do. A partition
// attached again without the rule is back in every lookup until upkeep has read it too.
func TestUpkeepBringsOldPartitionsUnderTheRule(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5) // up to 0005: the previous release
	now := time.Now()
	day := func(d int) partition.Partition { return partition.At(partition.Daily, now.AddDate(0, 0, d)) }
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, day(-4).From, 6); err != nil {
		t.Fatal(err)
	}
	records := []struct {
		what  string
		key   string
		dated time.Time
	}{
		{"a record in the partition before its key's, 70 s early", keyAt(day(-3).From.Add(10 * time.Second)), day(-3).From.Add(-time.Minute)},
		{"a record a minute before its key, in its key's partition", keyAt(day(-2).From.Add(2 * time.Hour)), day(-2).From.Add(2*time.Hour - time.Minute)},
		{"a record dated after its key", keyAt(day(-1).From.Add(time.Hour)), day(-1).From.Add(2 * time.Hour)},
		{"a record whose key has no floor", "order-1234", day(-4).From.Add(time.Hour)},
	}
	var reqs []TransferRequest
	for i, rec := range records {
		r := testTransfer(rec.key, int64(100+i))
		transferOutcome(t, pool, r, Applied)
		mustExec(t, pool, "UPDATE idempotency_record SET created_at = $2 WHERE key = $1", rec.key, rec.dated)
		reqs = append(reqs, r)
	}
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if u := recordFloor(t, pool); !u.Equal(day(2).To) {
		t.Fatalf("unchecked_before after the upgrade: %v, want the end of the latest partition, %v", u, day(2).To)
	}

	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: 720 * time.Hour}
	rep, err := Upkeep(ctx, pool, opts)
	if err != nil || rep.RuleHeld != "" {
		t.Fatal(err, rep.RuleHeld)
	}
	var newestFirst []string
	for d := 2; d >= -4; d-- {
		newestFirst = append(newestFirst, day(d).Name)
	}
	if !slices.Equal(rep.Checked, newestFirst) {
		t.Errorf("brought under the rule %v, want every partition newest first, %v", rep.Checked, newestFirst)
	}
	if u := recordFloor(t, pool); !u.Equal(day(-4).From) || !rep.State.UncheckedBefore.Equal(u) {
		t.Errorf("unchecked_before %v (reported %v), want the oldest partition's lower bound %v", u, rep.State.UncheckedBefore, day(-4).From)
	}
	if e := earlyBy(t, pool); e != 70*time.Second {
		t.Errorf("early_by %v, want the earliest-dated record's 70 s", e)
	}
	for i, rec := range records {
		var dated time.Time
		if err := pool.QueryRow(ctx, "SELECT created_at FROM idempotency_record WHERE key = $1", rec.key).Scan(&dated); err != nil {
			t.Fatal(err)
		}
		if !dated.Equal(rec.dated) {
			t.Errorf("%s: dated %v, want %v as it was", rec.what, dated, rec.dated)
		}
		assertDecides(t, pool, reqs[i], rec.what)
		if ledger, recs := counts(t, pool, rec.key); ledger != 1 || recs != 1 {
			t.Errorf("%s: %d debits and %d records, want 1 and 1", rec.what, ledger, recs)
		}
	}
	if rep, err := Upkeep(ctx, pool, opts); err != nil || len(rep.Checked) != 0 {
		t.Errorf("the next pass: brought %v under the rule (%v), want nothing left", rep.Checked, err)
	}

	// Today's partition detached by hand, its copy of the rule dropped and a record in it dated
	// before its key: attached again, the rule comes back NOT VALID and today's partition and
	// every one before it go back into every lookup, until the next pass.
	late := testTransfer(keyAt(now.Add(-time.Minute)), 200)
	transferOutcome(t, pool, late, Applied)
	mustExec(t, pool, "ALTER TABLE idempotency_record DETACH PARTITION "+day(0).Name)
	mustExec(t, pool, fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s", day(0).Name, keyFloorRule))
	lateDated := now.Add(-31 * time.Minute).Truncate(time.Millisecond) // before its key, within maxEarlyBy, and today
	if lateDated.Before(day(0).From) {
		lateDated = day(0).From
	}
	mustExec(t, pool, fmt.Sprintf("UPDATE %s SET created_at = $2 WHERE key = $1", day(0).Name), late.Key, lateDated)
	if names, err := EnsurePartitions(ctx, pool, partition.Daily, now, 2); err != nil || !slices.Equal(names, []string{day(0).Name}) {
		t.Fatalf("attach again: %v %v, want %s", names, err, day(0).Name)
	}
	if u := recordFloor(t, pool); !u.Equal(day(0).To) {
		t.Errorf("after attaching a partition without the rule, unchecked_before %v, want its end %v", u, day(0).To)
	}
	assertDecides(t, pool, late, "a record dated before its key, attached again")
	rep, err = Upkeep(ctx, pool, opts)
	if want := []string{day(0).Name, day(-1).Name, day(-2).Name, day(-3).Name, day(-4).Name}; err != nil || !slices.Equal(rep.Checked, want) {
		t.Errorf("the pass after: brought %v under the rule (%v), want %v", rep.Checked, err, want)
	}
	if u := recordFloor(t, pool); !u.Equal(day(-4).From) {
		t.Errorf("unchecked_before %v, want %v again", u, day(-4).From)
	}
	if e, want := earlyBy(t, pool), max(70*time.Second, keyFloor(t, pool, late.Key).Sub(lateDated)); e != want {
		t.Errorf("early_by %v, want %v", e, want)
	}
	assertDecides(t, pool, late, "a record dated before its key, attached again and read")
}

// Bringing partitions under the rule only reads them: a pass runs beside a transfer whose
// transaction is still open, and beside a range move's settle, which holds the ownership lock
// exclusively.
func TestBringingUnderTheRuleLeavesTransfersAlone(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5)
	yesterday := partition.At(partition.Daily, time.Now().AddDate(0, 0, -1))
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, yesterday.From, 3); err != nil {
		t.Fatal(err)
	}
	early := testTransfer(keyAt(time.Now().Add(-time.Hour)), 3)
	transferOutcome(t, pool, early, Applied)
	mustExec(t, pool, "UPDATE idempotency_record SET created_at = $2 WHERE key = $1", early.Key, time.Now().Add(-time.Hour-30*time.Second))
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx) //nolint:errcheck // committed below
	args, err := batchArgs([]TransferRequest{testTransfer(keyAt(time.Now()), 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open.Exec(ctx, groupSQL(applyRows), args...); err != nil {
		t.Fatal(err)
	}
	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: 720 * time.Hour, LockTimeout: 2 * time.Second}
	rep, err := Upkeep(ctx, pool, opts)
	if err != nil || rep.RuleHeld != "" || !slices.Contains(rep.Checked, yesterday.Name) {
		t.Fatalf("upkeep beside an open transfer: brought %v under the rule (%v; held back: %q), want %s among them", rep.Checked, err, rep.RuleHeld, yesterday.Name)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Once more, as if just upgraded, while a settle holds the ownership lock.
	mustExec(t, pool, "UPDATE shardgate_record_floor SET unchecked_before = 'infinity', early_by = '0'")
	settle, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer settle.Rollback(ctx) //nolint:errcheck // only its lock matters
	if _, err := settle.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := settle.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockClass, LockOwnership); err != nil {
		t.Fatal(err)
	}
	rep, err = Upkeep(ctx, pool, opts)
	if err != nil || rep.RuleHeld != "" || !slices.Contains(rep.Checked, yesterday.Name) {
		t.Fatalf("upkeep beside a settle: brought %v under the rule (%v; held back: %q), want %s among them", rep.Checked, err, rep.RuleHeld, yesterday.Name)
	}
	if err := settle.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertDecides(t, pool, early, "a record dated 30 s before its key")
}

// A record dated days before its key (a clock far off, before the router refused such keys)
// would widen every lookup for good: its partition stays in every lookup instead, with those
// before it, until retention drops it, and the pass says why. The record still decides.
func TestARecordFarBeforeItsKeyKeepsItsPartitionInEveryLookup(t *testing.T) {
	ctx := context.Background()
	pool, _ := releaseDB(t, 5)
	day := func(d int) partition.Partition { return partition.At(partition.Daily, time.Now().AddDate(0, 0, d)) }
	if _, err := EnsurePartitions(ctx, pool, partition.Daily, day(-2).From, 4); err != nil {
		t.Fatal(err)
	}
	ahead := testTransfer(keyAt(day(5).From.Add(time.Hour)), 7)
	transferOutcome(t, pool, ahead, Applied)
	mustExec(t, pool, "UPDATE idempotency_record SET created_at = $2 WHERE key = $1", ahead.Key, day(-1).From.Add(time.Hour))
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	opts := UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: 720 * time.Hour}
	for pass := 1; pass <= 2; pass++ {
		rep, err := Upkeep(ctx, pool, opts)
		if want := []string{day(2).Name, day(1).Name, day(0).Name}; pass == 1 && (err != nil || !slices.Equal(rep.Checked, want)) {
			t.Fatalf("brought %v under the rule (%v), want %v", rep.Checked, err, want)
		}
		if err != nil || !strings.Contains(rep.RuleHeld, day(-1).Name) || !strings.Contains(rep.RuleHeld, "144h0m0s before its key") {
			t.Errorf("pass %d: held back %q (%v), want it to name %s and say its record is dated 144h before its key", pass, rep.RuleHeld, err, day(-1).Name)
		}
	}
	if u, e := recordFloor(t, pool), earlyBy(t, pool); !u.Equal(day(0).From) || e != 0 {
		t.Errorf("unchecked_before %v and early_by %v, want %v and 0", u, e, day(0).From)
	}
	assertDecides(t, pool, ahead, "a record six days before its key")
}
