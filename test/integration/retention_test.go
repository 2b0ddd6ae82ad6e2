package integration

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
)

// retention is the suite's idempotency.retention (routerYAML).
const retention = 720 * time.Hour

// A record written at 23:59:59.9 yesterday (UTC), in yesterday's partition, makes every retry
// arriving today replay byte for byte, twenty at once, and never adds a ledger row.
func TestRetryStraddlingMidnightReplays(t *testing.T) {
	const src = 7201
	shard := shardOf(src)
	ctx := context.Background()
	pool := env.pools[shard]
	if _, err := idem.EnsurePartitions(ctx, pool, partition.Daily, time.Now().Add(-24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	key, body := newKey(), transferBody(src, 7202, 75)
	first := post(t, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	var at time.Time
	if err := pool.QueryRow(ctx, `UPDATE idempotency_record SET created_at = date_trunc('day', now(), 'UTC') - interval '100 milliseconds'
		WHERE key = $1 RETURNING created_at`, key).Scan(&at); err != nil {
		t.Fatal(err)
	}
	var part string
	if err := pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM idempotency_record WHERE key = $1", key).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if want := partition.At(partition.Daily, at).Name; part != want {
		t.Fatalf("record at %v is in %s, want %s", at.UTC(), part, want)
	}

	var wg sync.WaitGroup
	replies := make([]reply, 20)
	for i := range replies {
		wg.Go(func() { replies[i] = post(t, key, body) })
	}
	wg.Wait()
	for i, r := range replies {
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
			t.Errorf("retry %d: %d replayed=%q %s, want the stored 201", i, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	if all, _ := records(t, shard, key); all != 1 {
		t.Errorf("%d records, want 1", all)
	}
}

// Without the partition for now a shard fails closed: 503 storage-not-ready with Retry-After,
// nothing stored. Upkeep attaches the partition again, and the same key then applies once.
func TestMissingPartitionIs503UntilUpkeep(t *testing.T) {
	const src = 7301
	shard := shardOf(src)
	ctx := context.Background()
	pool := env.pools[shard]
	opts := idem.UpkeepOptions{Interval: partition.Daily, Ahead: 2, Retention: retention}
	var current string
	if err := pool.QueryRow(ctx, `SELECT 'idempotency_record_' || to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM_DD')`).Scan(&current); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE idempotency_record DETACH PARTITION "+current); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			idem.Upkeep(ctx, pool, opts) //nolint:errcheck // best effort: leave the suite a working shard
		}
	})

	key, body := newKey(), transferBody(src, 7302, 60)
	r := post(t, key, body)
	if r.status != http.StatusServiceUnavailable || r.problemType() != "storage-not-ready" || r.header.Get("Retry-After") != "2" {
		t.Errorf("without a partition: %d %v %s, want 503 storage-not-ready with Retry-After: 2", r.status, r.header, r.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 0 {
		t.Errorf("the refused transfer left %d ledger rows", n)
	}

	rep, err := idem.Upkeep(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	restored = true
	if !slices.Equal(rep.Reattached, []string{current}) {
		t.Errorf("upkeep report %+v, want %s attached again", rep, current)
	}
	if r := post(t, key, body); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("after upkeep: %d replayed=%q %s, want a fresh 201", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if r := post(t, key, body); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after upkeep: %d %s, want the replay", r.status, r.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// Two routers' upkeeps run over and over on every shard, creating and dropping partitions,
// while clients post transfers and retries: no request fails, no upkeep fails, and every key is
// applied exactly once.
func TestUpkeepUnderLoadFailsNoTransfer(t *testing.T) {
	ctx := context.Background()
	seedFrom := time.Date(2002, 1, 1, 0, 0, 0, 0, time.UTC)
	const seeded = 30
	for _, s := range env.m.Shards {
		// Partitions an earlier test (or an earlier run on the same shards) made far ahead would
		// leave the upkeeps below nothing to create.
		dropEmptyPartitionsFrom(t, env.pools[s.Name], time.Now().AddDate(0, 0, 3))
		if _, err := idem.EnsurePartitions(ctx, env.pools[s.Name], partition.Daily, seedFrom, seeded-1); err != nil {
			t.Fatal(err)
		}
	}

	type sent struct {
		key string
		src int64
	}
	var (
		stop    atomic.Bool
		workers sync.WaitGroup
		mu      sync.Mutex
		applied = map[string][]string{} // shard → transfer ids
	)
	for w := range 6 {
		workers.Go(func() {
			var done []sent
			for i := 0; !stop.Load(); i++ {
				tr, retry := sent{newKey(), int64(80000 + w*1000 + i)}, false
				if i%3 == 2 && len(done) > 0 {
					tr, retry = done[len(done)/2], true
				}
				r := post(t, tr.key, transferBody(tr.src, 1, 5))
				switch {
				case r.status != http.StatusCreated:
					t.Errorf("transfer during upkeep: %d %s", r.status, r.body)
				case retry != (r.header.Get("Idempotent-Replayed") == "true"):
					t.Errorf("retry %t, but Idempotent-Replayed is %q", retry, r.header.Get("Idempotent-Replayed"))
				case !retry:
					done = append(done, tr)
					mu.Lock()
					applied[shardOf(tr.src)] = append(applied[shardOf(tr.src)], transferID(tr.src, tr.key))
					mu.Unlock()
				}
			}
		})
	}

	var (
		upkeepers        sync.WaitGroup
		created, dropped atomic.Int64
		skipped          atomic.Int64
	)
	deadline := time.Now().Add(3 * time.Second)
	for range 2 { // two routers
		upkeepers.Go(func() {
			for i := 0; time.Now().Before(deadline) || i < 2; i++ {
				cutoff := seedFrom.AddDate(0, 0, min(i+1, seeded))
				for _, s := range env.m.Shards {
					rep, err := idem.Upkeep(ctx, env.pools[s.Name], idem.UpkeepOptions{
						Interval: partition.Daily, Ahead: 2 + min(i, 8), Retention: time.Since(cutoff)})
					if err != nil {
						t.Errorf("upkeep on %s: %v", s.Name, err)
						return
					}
					if rep.Skipped {
						skipped.Add(1)
					}
					created.Add(int64(len(rep.Created)))
					dropped.Add(int64(len(rep.Dropped)))
				}
			}
		})
	}
	upkeepers.Wait()
	stop.Store(true)
	workers.Wait()

	if created.Load() == 0 || dropped.Load() == 0 {
		t.Errorf("upkeep created %d and dropped %d partitions during the run; want some of each", created.Load(), dropped.Load())
	}
	total := 0
	for shard, ids := range applied {
		var n int
		if err := env.pools[shard].QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out' AND transfer_id = ANY($1)", ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != len(ids) {
			t.Errorf("shard %s: %d ledger rows for %d applied keys", shard, n, len(ids))
		}
		total += n
	}
	t.Logf("%d transfers applied; upkeep created %d and dropped %d partitions, %d passes skipped", total, created.Load(), dropped.Load(), skipped.Load())

	// Leave no seeded partition behind.
	for _, s := range env.m.Shards {
		if _, err := idem.Upkeep(ctx, env.pools[s.Name], idem.UpkeepOptions{Interval: partition.Daily, Ahead: 2,
			Retention: time.Since(seedFrom.AddDate(0, 0, seeded))}); err != nil {
			t.Error(err)
		}
	}
}

// dropEmptyPartitionsFrom drops the daily partitions of idempotency_record on pool that start at
// or after from's day; each must be empty (nothing is stored ahead of now).
func dropEmptyPartitionsFrom(t *testing.T, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'idempotency_record'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	first := partition.At(partition.Daily, from).From
	for _, name := range names {
		if p, ok := partition.ParseName(name); !ok || p.From.Before(first) {
			continue
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()).Scan(&n); err != nil || n != 0 {
			t.Fatalf("partition %s ahead of now holds %d rows (%v)", name, n, err)
		}
		if _, err := pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
}
