package idem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// BenchmarkGroupFunctions measures one item of a group of k new transfers through each group
// function, on a shard that owns both accounts (so each item writes its debit, its record and its
// credit). It is what places setWiseFrom: the smallest group for which shardgate_apply_batch
// costs less per item than shardgate_apply_rows. Keys are UUIDv7, as the Go client makes them,
// or opaque strings (keys=opaque: no floor, every partition is read); partitions=4 is a fresh
// shard's (today and three ahead), partitions=34 one that has run a while at the default
// retention (30 days of daily partitions). unchecked counts the partitions every lookup reads
// whatever its key's time: 0 on a shard whose records are all under 0006's key-floor rule, all of
// them on one just upgraded to 0006, until upkeep has brought its old partitions under the rule.
//
//	go test ./idem -run '^$' -bench GroupFunctions -benchtime 2000x -count 3
func BenchmarkGroupFunctions(b *testing.B) {
	for _, c := range []struct{ days, unchecked int }{{0, 0}, {30, 0}, {30, 34}} {
		ctx := context.Background()
		pool := migratedDB(b, fmt.Sprintf("days%d_%d", c.days, c.unchecked))
		all, _ := shardmap.ParseKeyRange("-")
		if err := ApplyOwnership(ctx, pool, Ownership{Shard: "bench", MapVersion: 1, Ranges: []shardmap.KeyRange{all}}, Grant); err != nil {
			b.Fatal(err)
		}
		if _, err := EnsurePartitions(ctx, pool, partition.Daily, time.Now().AddDate(0, 0, -c.days), c.days+3); err != nil {
			b.Fatal(err)
		}
		if c.unchecked == 0 {
			// As on a shard migrated longer ago than retention, or brought under the rule by upkeep.
			mustExec(b, pool, "UPDATE shardgate_record_floor SET unchecked_before = now() - make_interval(days => $1 + 1)", c.days)
		} else {
			// As 0006 leaves a shard it upgrades: the end of its latest partition.
			mustExec(b, pool, "UPDATE shardgate_record_floor SET unchecked_before = $1", partition.At(partition.Daily, time.Now().AddDate(0, 0, 3)).To)
		}
		b.Run(fmt.Sprintf("partitions=%d/unchecked=%d", c.days+4, c.unchecked), func(b *testing.B) { benchGroupFunctions(b, pool) })
	}
}

func benchGroupFunctions(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	run := 0 // a benchmark function runs more than once (b.N=1 first): opaque keys stay new
	for _, keys := range []string{"uuidv7", "opaque"} {
		for _, k := range []int{1, 2, 3, 4, 6, 8, 16, 64} {
			for _, fn := range []string{applyRows, applyBatch} {
				b.Run(fmt.Sprintf("keys=%s/%s/k=%d", keys, fn, k), func(b *testing.B) {
					run++
					q := groupSQL(fn)
					for n := range b.N {
						group := newBenchGroup(rng, k, keys == "uuidv7", fmt.Sprintf("bench-%d-%d", run, n))
						res, err := transferGroup(ctx, pool, group, q)
						if err != nil {
							b.Fatal(err)
						}
						for i, r := range res {
							if r.Outcome != Applied || !r.CreditSettled {
								b.Fatalf("item %d: %s (credit settled %t), want applied with its credit", i, r.Outcome, r.CreditSettled)
							}
						}
					}
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*k), "µs/item")
				})
			}
		}
	}
}

// newBenchGroup returns k new debits between random accounts of one shard, under UUIDv7 keys or
// under opaque keys made from prefix.
func newBenchGroup(rng *rand.Rand, k int, uuidv7 bool, prefix string) []TransferRequest {
	group := make([]TransferRequest, k)
	for i := range group {
		src := rng.Int64N(1_000_000) + 1
		key := fmt.Sprintf("%s-%d", prefix, i)
		if uuidv7 {
			key = uuid.Must(uuid.NewV7()).String()
		}
		group[i] = testTransfer(key, rng.Int64N(100_000)+1)
		group[i].Src, group[i].Dst = src, src+1
		group[i].KeyspaceID, group[i].DstKeyspaceID = shardmap.KeyspaceID(src), shardmap.KeyspaceID(src+1)
	}
	return group
}
