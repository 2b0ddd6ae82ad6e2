package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// Migrate applies schema migrations and partition upkeep on every shard, then makes the shards
// own the key ranges of m (revoke everywhere, then grant everywhere).
func Migrate(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
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
	if err := Upkeep(ctx, cfg, m, topo.Pool, out, nil); err != nil {
		return err
	}
	return applyMap(ctx, cfg, m, topo.Pool, out)
}

// applyMap makes every shard own its ranges of m, moving the rows of ranges that change owner,
// and reports the moves.
func applyMap(ctx context.Context, cfg *config.Config, m *shardmap.Map, pool func(string) *pgxpool.Pool, out io.Writer) error {
	return applyMapWith(ctx, cfg, m, pool, out, nil)
}

func applyMapWith(ctx context.Context, cfg *config.Config, m *shardmap.Map, pool func(string) *pgxpool.Pool, out io.Writer, onFenced func() error) error {
	moves, err := rangemove.Apply(ctx, m, pool, rangemove.Options{Interval: cfg.Idempotency.PartitionInterval, Pace: cfg.RangeMoves.Pace,
		Progress: progressPrinter(out), OnFenced: onFenced})
	for _, mv := range moves {
		fmt.Fprintf(out, "moved rows of %s from %s to %s: %d idempotency records, %d ledger rows, %d owed credits\n", mv.Range, mv.From, mv.To, mv.Records, mv.Ledger, mv.Credits)
		if mv.Conflicts > 0 {
			fmt.Fprintf(out, "warning: %d keys moved from %s were already used on %s for other requests (keys reused across shards); %s's records were kept\n",
				mv.Conflicts, mv.From, mv.To, mv.To)
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "ownership: %d shards own their ranges at shard map version %d\n", len(m.Shards), m.Version)
	return nil
}

// Maintain runs one pass of partition upkeep on every shard.
func Maintain(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	return Upkeep(ctx, cfg, m, topo.Pool, out, nil)
}

// Upkeep runs one pass of partition upkeep (idem.Upkeep) on every shard: it keeps the current
// and partitions_ahead future partitions ready, and detaches and drops partitions whose whole
// range is older than retention. It prints what it created and dropped per shard, records each
// result in stats unless it is nil (a serving router passes its metrics collector), and fails if any shard
// failed. A shard where another router's upkeep is running is skipped, which is no failure.
func Upkeep(ctx context.Context, cfg *config.Config, m *shardmap.Map, pool func(string) *pgxpool.Pool, out io.Writer, stats *idem.UpkeepCollector) error {
	opts := idem.UpkeepOptions{
		Interval:  cfg.Idempotency.PartitionInterval,
		Ahead:     cfg.Idempotency.PartitionsAhead,
		Retention: cfg.Idempotency.Retention,
	}
	var failed, names []string
	for _, s := range m.Shards {
		names = append(names, s.Name)
		rep, err := idem.Upkeep(ctx, pool(s.Name), opts)
		if stats != nil {
			stats.Record(s.Name, rep, err)
		}
		fmt.Fprintf(out, "shard %s: %s\n", s.Name, describeUpkeep(rep, err))
		if rep.RuleHeld != "" {
			fmt.Fprintf(out, "shard %s: %s: %s\n", s.Name, ruleHeld, rep.RuleHeld)
		}
		if err == nil {
			err = sweepUpgrade(ctx, pool(s.Name), s.Name, out)
		}
		if err == nil {
			err = clearSettled(ctx, pool(s.Name), cfg.Relay.KeepSettled, s.Name, out)
		}
		if err != nil {
			failed = append(failed, s.Name)
		}
	}
	if stats != nil {
		stats.Retain(names)
	}
	if len(failed) > 0 {
		return fmt.Errorf("partition upkeep failed on %s", strings.Join(failed, ", "))
	}
	return nil
}

// sweepUpgrade makes owed, once, the credits of debits that routers of the previous release
// wrote while migration 0004 ran (idem.SweepUpgradeWindow).
func sweepUpgrade(ctx context.Context, pool *pgxpool.Pool, shard string, out io.Writer) error {
	n, ran, err := idem.SweepUpgradeWindow(ctx, pool, idem.UpgradeSweepGrace)
	switch {
	case err != nil:
		fmt.Fprintf(out, "shard %s: %s: sweeping the upgrade window for owed credits: %v\n", shard, upkeepFailed, err)
	case ran:
		fmt.Fprintf(out, "shard %s: swept the window of migration 0004: %d debits of routers of the previous release made their credit owed\n", shard, n)
	}
	return err
}

// clearSettled deletes the shard's owed-credit rows settled longer ago than keep: the credits
// are in their shards' ledgers, which is what a transfer's status reads once the row is gone.
func clearSettled(ctx context.Context, pool *pgxpool.Pool, keep time.Duration, shard string, out io.Writer) error {
	n, err := idem.ClearSettled(ctx, pool, keep)
	switch {
	case err != nil:
		fmt.Fprintf(out, "shard %s: %s: clearing settled credits: %v\n", shard, upkeepFailed, err)
	case n > 0:
		fmt.Fprintf(out, "shard %s: cleared %d settled owed-credit rows older than %s\n", shard, n, keep)
	}
	return err
}

// Words of upkeep's report that its log level is chosen by.
const (
	upkeepFailed  = "partition upkeep failed"
	upkeepNothing = "partitions ready, none created or dropped"
	ruleHeld      = "key-floor rule held back"
)

// describeUpkeep is one shard's line of upkeep's report.
func describeUpkeep(rep idem.UpkeepReport, err error) string {
	var parts []string
	for _, did := range []struct {
		verb  string
		names []string
	}{{"created", rep.Created}, {"attached again", rep.Reattached}, {"dropped", rep.Dropped}, {"put under the key-floor rule (looked up by key time from now on)", rep.Checked}} {
		if len(did.names) > 0 {
			parts = append(parts, did.verb+" "+strings.Join(did.names, ", "))
		}
	}
	switch {
	case err != nil && len(parts) > 0:
		return fmt.Sprintf("%s after it %s: %v", upkeepFailed, strings.Join(parts, "; "), err)
	case err != nil:
		return fmt.Sprintf("%s: %v", upkeepFailed, err)
	case rep.Skipped:
		return "partition upkeep skipped: another router is running it on this shard"
	case len(parts) == 0:
		return upkeepNothing
	}
	return strings.Join(parts, "; ")
}

// ApplyMap makes the shards of m own its ranges, moving rows (`router shardmap apply`).
func ApplyMap(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	return applyMap(ctx, cfg, m, topo.Pool, out)
}

// logWriter turns upkeep's per-shard report lines into log records: a failure is an error, a
// key-floor catch-up held back a warning.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSuffix(string(p), "\n")
	switch {
	case strings.Contains(line, upkeepFailed):
		w.log.Error("partition upkeep failed", "report", line)
	case strings.Contains(line, ruleHeld):
		w.log.Warn("partition upkeep", "report", line)
	case strings.HasSuffix(line, upkeepNothing):
		// The hourly pass that changes nothing, and the pass at start right after `migrate`
		// (which printed its own report), are not news.
		w.log.Debug("partition upkeep", "report", line)
	default:
		w.log.Info("partition upkeep", "report", line)
	}
	return len(p), nil
}

var _ io.Writer = logWriter{}

// PlanMap prints what ApplyMap would move for m, and changes nothing (`shardmap apply
// --dry-run`). It refuses what the apply would refuse.
func PlanMap(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	moves, err := rangemove.Plan(ctx, m, topo.Pool)
	if err != nil {
		return err
	}
	for _, mv := range moves {
		fmt.Fprintf(out, "would move %s from %s to %s: %d idempotency records, %d ledger rows, %d owed credits; copy about %v at %d rows/s paced at %g while %s serves, then a fence of about a second\n",
			mv.Range, mv.From, mv.To, mv.Records, mv.Ledger, mv.Credits, rangemove.Estimate(mv, cfg.RangeMoves.Pace), rangemove.EstimateRate, cfg.RangeMoves.Pace, mv.From)
	}
	if len(moves) == 0 {
		fmt.Fprintln(out, "no range changes owner")
	}
	fmt.Fprintf(out, "dry run: nothing changed; without --dry-run, apply makes %d shards own their ranges at version %d\n", len(m.Shards), m.Version)
	return nil
}

// Reconcile checks that the ledgers of m's shards add up (package reconcile) and prints the
// report to out. With repair, it then makes every missing credit owed again, logging each
// action, and checks again. It fails when discrepancies remain or the check could not be made.
func Reconcile(ctx context.Context, cfg *config.Config, m *shardmap.Map, opts reconcile.Options, repair bool, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	rep, err := reconcile.Run(ctx, m, topo.Pool, opts)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	rep.Print(out)
	if repair && len(rep.Missing) > 0 {
		fmt.Fprintln(out)
		n, err := reconcile.Repair(ctx, m, topo.Pool, rep, out)
		if err != nil {
			return fmt.Errorf("reconcile --repair: %w (%d credits owed again before it)", err, n)
		}
		fmt.Fprintf(out, "repair: %d credits owed again; the relay of any running router delivers them\n\nafter repair:\n", n)
		if rep, err = reconcile.Run(ctx, m, topo.Pool, opts); err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		rep.Print(out)
	}
	if !rep.Clean() {
		return fmt.Errorf("reconcile: the ledgers do not add up: %d discrepancies, listed above", rep.Discrepancies())
	}
	return nil
}
