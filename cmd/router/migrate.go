package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
)

// migrate applies schema migrations and partition upkeep on every shard, then makes the shards
// own the key ranges of m (revoke everywhere, then grant everywhere).
func migrate(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := openTopology(cfg, m)
	if err != nil {
		return err
	}
	defer topo.Close()
	for _, s := range m.Shards {
		applied, err := idem.Migrate(ctx, topo.Pool(s.Name))
		if err != nil {
			return fmt.Errorf("shard %s: %w", s.Name, err)
		}
		if len(applied) == 0 {
			fmt.Fprintf(out, "shard %s: schema up to date\n", s.Name)
		} else {
			fmt.Fprintf(out, "shard %s: applied %s\n", s.Name, strings.Join(applied, ", "))
		}
	}
	if err := upkeep(ctx, cfg, m, topo.Pool, out); err != nil {
		return err
	}
	return applyMap(ctx, cfg, m, topo.Pool, out)
}

// applyMap makes every shard own its ranges of m, moving the rows of ranges that change owner,
// and reports the moves.
func applyMap(ctx context.Context, cfg *config.Config, m *shardmap.Map, pool func(string) *pgxpool.Pool, out io.Writer) error {
	moves, err := idem.ApplyMap(ctx, m, pool, cfg.Idempotency.PartitionInterval)
	for _, mv := range moves {
		fmt.Fprintf(out, "moved rows of %s from %s to %s: %d idempotency records, %d ledger rows\n", mv.Range, mv.From, mv.To, mv.Records, mv.Ledger)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "ownership: %d shards own their ranges at shard map version %d\n", len(m.Shards), m.Version)
	return nil
}

// maintainOnce runs one pass of partition upkeep on every shard.
func maintainOnce(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := openTopology(cfg, m)
	if err != nil {
		return err
	}
	defer topo.Close()
	return upkeep(ctx, cfg, m, topo.Pool, out)
}

// upkeep keeps the current and the configured number of future partitions ready on every
// shard. It reports each shard's result and fails if any shard failed.
func upkeep(ctx context.Context, cfg *config.Config, m *shardmap.Map, pool func(string) *pgxpool.Pool, out io.Writer) error {
	var failed []string
	for _, s := range m.Shards {
		created, err := idem.EnsurePartitions(ctx, pool(s.Name), cfg.Idempotency.PartitionInterval, time.Now(), cfg.Idempotency.PartitionsAhead)
		if err != nil {
			fmt.Fprintf(out, "shard %s: partition upkeep failed: %v\n", s.Name, err)
			failed = append(failed, s.Name)
			continue
		}
		if len(created) == 0 {
			fmt.Fprintf(out, "shard %s: partitions ready, none created\n", s.Name)
		} else {
			fmt.Fprintf(out, "shard %s: created %s\n", s.Name, strings.Join(created, ", "))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("partition upkeep failed on %s", strings.Join(failed, ", "))
	}
	return nil
}
