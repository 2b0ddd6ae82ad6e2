package idem

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/partition"
)

// fillRows gives the tables that migrations 0010 and 0011 index n rows each (the records in
// today's partition), so that building an index takes a while.
func fillRows(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, client)
		SELECT 'fill-' || g, g, g, g + 1, 1, 'EUR', 'transfer_out', 'fill' FROM generate_series(1, $1) g`, n)
	mustExec(t, pool, `INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, client, debited_at)
		SELECT 'fill-' || g, g, g, g + 1, 1, 'EUR', 'fill', now() FROM generate_series(1, $1) g`, n)
	mustExec(t, pool, `INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
		SELECT 'fill-' || g, 'fill', 'h', g, '{}', 'completed' FROM generate_series(1, $1) g`, n)
	mustExec(t, pool, "ANALYZE")
}

// invalidIndexes names the shard's indexes that are not valid.
func invalidIndexes(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var names []string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(indexrelid::regclass::text ORDER BY 1), '{}')
		FROM pg_index WHERE NOT indisvalid`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	return names
}

// appliedVersions is the versions shardgate_schema_migrations records after 7.
func appliedVersions(t *testing.T, pool *pgxpool.Pool) []int32 {
	t.Helper()
	var vs []int32
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(version ORDER BY version), '{}')
		FROM shardgate_schema_migrations WHERE version > 7`).Scan(&vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

// partitionsLacking names the partitions of idempotency_record without an index attached to
// idempotency_record_keyspace_idx.
func partitionsLacking(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var names []string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(c.relname::text ORDER BY 1), '{}')
		FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = 'idempotency_record'::regclass
		  AND NOT EXISTS (SELECT FROM pg_inherits ih JOIN pg_index i ON i.indexrelid = ih.inhrelid
		                   WHERE ih.inhparent = 'idempotency_record_keyspace_idx'::regclass AND i.indrelid = c.oid)`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	return names
}

func TestOnlineIndexDeclarations(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int][]string{}
	for _, m := range ms {
		for _, ix := range m.OnlineIndexes {
			got[m.Version] = append(got[m.Version], fmt.Sprintf("%s ON %s %s", ix.Name, ix.Table, ix.definition()))
		}
		for _, name := range m.DropIndexes {
			got[m.Version] = append(got[m.Version], "drop "+name)
		}
	}
	want := map[int][]string{
		10: {"ledger_entries_created_idx ON ledger_entries (created_at)", "shardgate_credit_outbox_debited_idx ON shardgate_credit_outbox (debited_at)"},
		11: {"idempotency_record_keyspace_idx ON idempotency_record (keyspace_id, scope, key)", "ledger_entries_keyspace_idx ON ledger_entries (keyspace_id, id)",
			"shardgate_credit_outbox_keyspace_idx ON shardgate_credit_outbox (keyspace_id, transfer_id)"},
		12: {"ledger_entries_created_brin ON ledger_entries USING brin (created_at) WITH (pages_per_range = 32, autosummarize = on)",
			"shardgate_credit_outbox_debited_brin ON shardgate_credit_outbox USING brin (debited_at) WITH (pages_per_range = 32, autosummarize = on)",
			"drop ledger_entries_created_idx", "drop shardgate_credit_outbox_debited_idx"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("online indexes %v, want %v", got, want)
	}
	for _, m := range ms {
		if strings.Contains(strings.ToUpper(m.SQL), "LOCK TABLE") && m.Version >= 10 {
			t.Errorf("migration %04d still locks tables", m.Version)
		}
	}
	for _, line := range []string{
		"-- shardgate: online-index x_idx ON x (a; DROP TABLE y)",
		"-- shardgate: online-index x_idx ON x USING brin (a) WITH (fillfactor = 1); DROP TABLE y",
		"-- shardgate: online-drop-index x_idx; DROP TABLE y",
	} {
		bad := withFiles(t, map[string]string{"migrations/0099_bad.sql": line + "\n"})
		if _, err := migrationsIn(bad); err == nil || !strings.Contains(err.Error(), "0099_bad.sql line 1") {
			t.Errorf("%s: %v, want an error naming the file and line", line, err)
		}
	}
}

// While this release's migrate builds its indexes on a shard of the previous release with a
// large ledger, the previous release's transfers keep completing: none waits for anything like
// the build.
func TestIndexBuildsDoNotHoldTransfers(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)
	fillRows(t, pool, 300_000)

	// The index builds run from the start of migrate until migration 0011 is recorded (the
	// function files are applied after it); only transfers begun in that window count.
	var building atomic.Bool
	var during atomic.Int64  // transfers begun while the indexes were built
	var longest atomic.Int64 // their longest latency, in ns
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				dst := here
				if i%2 == 1 {
					dst = there
				}
				in := building.Load()
				start := time.Now()
				got, err := prevGroup(ctx, pool, prevRowsSQL, debitTo(fmt.Sprintf("online-%d-%d", w, i), 1, dst))
				if err == nil && got[0] != "applied" {
					err = fmt.Errorf("outcome %s", got[0])
				}
				if err != nil {
					errs <- err
					return
				}
				if in {
					during.Add(1)
					for d := time.Since(start).Nanoseconds(); ; {
						old := longest.Load()
						if d <= old || longest.CompareAndSwap(old, d) {
							break
						}
					}
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	building.Store(true)
	began := time.Now()
	var built time.Time
	watched := make(chan error, 1)
	go func() {
		defer building.Store(false)
		for {
			var recorded bool
			if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM shardgate_schema_migrations WHERE version = 11)").Scan(&recorded); err != nil {
				watched <- err
				return
			}
			if recorded {
				built = time.Now()
				watched <- nil
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := Migrate(ctx, pool)
	if werr := <-watched; werr != nil {
		t.Error(werr)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a transfer during migrate: %v", e)
	}
	if err != nil {
		t.Fatal(err)
	}
	took, worst := built.Sub(began), time.Duration(longest.Load())
	t.Logf("the index builds took %v; %d transfers began during them, the longest took %v", took, during.Load(), worst)
	if took < time.Second {
		t.Fatalf("the index builds took %v: too short to tell whether transfers waited for them", took)
	}
	if during.Load() < 50 {
		t.Errorf("only %d transfers began during index builds of %v", during.Load(), took)
	}
	// A build that held writes would hold a transfer begun during it until the build's end: a
	// plain CREATE INDEX of the largest table held one for about 0.3 of took here, and builds
	// in one transaction all of it. A transfer takes milliseconds; a sixth of took leaves a busy
	// machine a margin of about five and still catches a build that holds writes.
	if worst > took/6 {
		t.Errorf("a transfer took %v during index builds of %v: it waited for one", worst, took)
	}
	if bad := invalidIndexes(t, pool); len(bad) != 0 {
		t.Errorf("invalid indexes after migrate: %v", bad)
	}
	if lacking := partitionsLacking(t, pool); len(lacking) != 0 {
		t.Errorf("partitions without the keyspace index: %v", lacking)
	}
}

// A migrate whose index build is cancelled half-way fails and records nothing for that
// migration; the invalid index it leaves is dropped and built again by the next migrate, which
// records the migration once.
func TestInterruptedIndexBuildIsCompleted(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)
	fillRows(t, pool, 200_000)

	done := make(chan error, 1)
	go func() {
		_, err := Migrate(ctx, pool)
		done <- err
	}()
	// Cancel the build of a partition's index (migration 0011) while it runs.
	var cancelled bool
	for deadline := time.Now().Add(time.Minute); !cancelled && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'CREATE INDEX CONCURRENTLY "idempotency_record_2%' AND state = 'active'`).Scan(&cancelled)
		if err != nil {
			t.Fatal(err)
		}
	}
	if !cancelled {
		t.Fatal("never saw the partition's index being built")
	}
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "0011_range_moves") || !strings.Contains(err.Error(), "idempotency_record_keyspace_idx") {
		t.Fatalf("the interrupted migrate: %v, want an error naming 0011 and its index", err)
	}
	if got := appliedVersions(t, pool); !slices.Equal(got, []int32{8, 10}) {
		t.Errorf("after the interrupted migrate, applied %v, want [8 10]", got)
	}
	// The parent's index stays invalid until every partition's is attached. The partition's own
	// is left invalid only when the cancel came after its build's first transaction committed the
	// catalog entry; a cancel before that leaves none.
	if bad := invalidIndexes(t, pool); len(bad) < 1 || len(bad) > 2 || !slices.Contains(bad, "idempotency_record_keyspace_idx") {
		t.Errorf("after the interrupted migrate, invalid indexes %v, want the parent's and at most one partition's", bad)
	}

	applied, err := Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[0] != "0011_range_moves" || slices.Contains(applied, "0010_reconcile_window") {
		t.Errorf("the next migrate applied %v, want 0011 first and not 0010", applied)
	}
	if got := appliedVersions(t, pool); !slices.Equal(got, []int32{8, 10, 11, 12}) {
		t.Errorf("applied %v, want [8 10 11 12]", got)
	}
	if bad := invalidIndexes(t, pool); len(bad) != 0 {
		t.Errorf("invalid indexes after the next migrate: %v", bad)
	}
	var byTime []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(indexname::text) FROM pg_indexes
		WHERE indexdef ~ '\((created_at|debited_at)\)'`).Scan(&byTime); err != nil {
		t.Fatal(err)
	}
	slices.Sort(byTime)
	if want := []string{"ledger_entries_created_brin", "shardgate_credit_outbox_debited_brin"}; !slices.Equal(byTime, want) {
		t.Errorf("indexes by time alone %v, want %v: 0012 replaces the btree indexes of 0010", byTime, want)
	}
	if lacking := partitionsLacking(t, pool); len(lacking) != 0 {
		t.Errorf("partitions without the keyspace index: %v", lacking)
	}
}

// Indexes left invalid or half-done by hand, the way PostgreSQL leaves a failed build (here a
// unique build that met duplicates, so of another definition than the migration's), are dropped
// and built again: each ends valid with the migration's definition.
func TestInvalidIndexesAreRebuilt(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)
	fillRows(t, pool, 1000)
	mustExec(t, pool, "INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, client) VALUES ('dup', 1, 1, 2, 1, 'EUR', 'transfer_out', 'fill')")
	var parts []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(c.relname::text ORDER BY 1) FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = 'idempotency_record'::regclass`).Scan(&parts); err != nil || len(parts) < 2 {
		t.Fatalf("partitions %v: %v", parts, err)
	}
	mustExec(t, pool, "INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state) VALUES ('fill-1', 'other', 'h', 1, '{}', 'completed')")
	for _, q := range []string{
		"CREATE UNIQUE INDEX CONCURRENTLY ledger_entries_keyspace_idx ON ledger_entries (keyspace_id)",
		"CREATE INDEX idempotency_record_keyspace_idx ON ONLY idempotency_record (keyspace_id, scope, key)",
		fmt.Sprintf("CREATE UNIQUE INDEX CONCURRENTLY %s ON %s (keyspace_id)", partitionIndexName(parts[0], OnlineIndex{Columns: "keyspace_id, scope, key"}), parts[0]),
	} {
		if _, err := pool.Exec(ctx, q); err == nil && strings.Contains(q, "UNIQUE") {
			t.Fatalf("%s did not fail", q)
		}
	}
	if bad := invalidIndexes(t, pool); len(bad) != 3 {
		t.Fatalf("invalid indexes made by hand: %v", bad)
	}
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if bad := invalidIndexes(t, pool); len(bad) != 0 {
		t.Errorf("invalid indexes after migrate: %v", bad)
	}
	var defs string
	if err := pool.QueryRow(ctx, `SELECT string_agg(indexdef, E'\n' ORDER BY indexname) FROM pg_indexes
		WHERE indexname IN ('ledger_entries_keyspace_idx', $1)`, partitionIndexName(parts[0], OnlineIndex{Columns: "keyspace_id, scope, key"})).Scan(&defs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(defs, "UNIQUE") || !strings.Contains(defs, "(keyspace_id, id)") || !strings.Contains(defs, "(keyspace_id, scope, key)") {
		t.Errorf("the rebuilt indexes:\n%s", defs)
	}
	if lacking := partitionsLacking(t, pool); len(lacking) != 0 {
		t.Errorf("partitions without the keyspace index: %v", lacking)
	}
}

// A shard migrated fresh and given partitions afterwards, and a shard of the previous release
// with partitions and rows upgraded, end with the same indexes, partitions' included, and so do
// they once upkeep has attached later partitions to both.
func TestOnlineIndexesOnPartitionsAgree(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	fresh := migratedDB(t, "fresh")
	if _, err := EnsurePartitions(ctx, fresh, partition.Daily, now, 1); err != nil {
		t.Fatal(err)
	}
	upgraded := pgtest.NewDB(t, "upgraded")
	restoreRelease(t, upgraded, 7)
	if _, err := EnsurePartitions(ctx, upgraded, partition.Daily, now, 1); err != nil {
		t.Fatal(err)
	}
	fillRows(t, upgraded, 1000)
	if _, err := Migrate(ctx, upgraded); err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"after the upgrade", "after later partitions"} {
		a, b := schemaOf(t, fresh), schemaOf(t, upgraded)
		if a["indexes"] != b["indexes"] {
			t.Errorf("%s, indexes differ:\nfresh\n%s\nupgraded\n%s", stage, a["indexes"], b["indexes"])
		}
		if !strings.Contains(b["indexes"], "_keyspace_id_scope_key_idx ON public.idempotency_record_") {
			t.Errorf("%s, no partition has the keyspace index:\n%s", stage, b["indexes"])
		}
		for _, pool := range []*pgxpool.Pool{fresh, upgraded} {
			if lacking := partitionsLacking(t, pool); len(lacking) != 0 {
				t.Errorf("%s, partitions without the keyspace index: %v", stage, lacking)
			}
			if bad := invalidIndexes(t, pool); len(bad) != 0 {
				t.Errorf("%s, invalid indexes: %v", stage, bad)
			}
			if _, err := EnsurePartitions(ctx, pool, partition.Daily, now, 4); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Two migrates of one shard at once, while its indexes are built: one applies everything, the
// other waits for it (without holding a snapshot that the builds would wait for in turn) and
// applies nothing.
func TestConcurrentMigratesTakeTurnsDuringIndexBuilds(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)
	fillRows(t, pool, 100_000)
	type result struct {
		applied []string
		err     error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			applied, err := Migrate(ctx, pool)
			results <- result{applied, err}
		}()
	}
	var counts []int
	for range 2 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("a migrate: %v", r.err)
			}
			counts = append(counts, len(r.applied))
		case <-time.After(2 * time.Minute):
			t.Fatal("two migrates at once did not finish")
		}
	}
	slices.Sort(counts)
	if counts[0] != 0 || counts[1] == 0 {
		t.Errorf("two migrates applied %v things, want everything once and nothing", counts)
	}
	if got := appliedVersions(t, pool); !slices.Equal(got, []int32{8, 10, 11, 12}) {
		t.Errorf("applied %v, want [8 10 11 12]", got)
	}
}
