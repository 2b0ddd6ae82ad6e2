package rangemove

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
)

// MoveStatus is a move out of one shard as that shard records it (shardgate_range_move).
type MoveStatus struct {
	From, To   string
	Range      string
	Phase      string
	MapVersion int64
	// Copied of Total rows by the bulk copy; Behind changes written since not yet on To.
	Copied, Total, Behind int64
	Started, Updated      time.Time
}

// ShardStatus is what one shard says about moves: its ownership, the moves out of it, and the
// moved ranges whose rows it has still to delete.
type ShardStatus struct {
	Shard     string
	Ownership idem.Ownership
	Moves     []MoveStatus
	Purges    []string
	Err       error // the shard could not be read; the rest is empty
}

// Status reads, from every shard of m, where its moves stand. A shard that cannot be read has
// Err set; the others are read all the same.
func Status(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool) []ShardStatus {
	var out []ShardStatus
	for _, s := range m.Shards {
		st := ShardStatus{Shard: s.Name}
		st.Err = pgx.BeginFunc(ctx, pool(s.Name), func(tx pgx.Tx) error {
			var err error
			if st.Ownership, err = idem.ReadOwnership(ctx, pool(s.Name)); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT m.key_range, m.dst, m.phase, m.map_version, m.rows_copied, m.rows_total,
				(SELECT count(*) FROM shardgate_range_change c WHERE c.keyspace_id >= m.lo AND (m.hi IS NULL OR c.keyspace_id < m.hi)),
				m.started_at, m.updated_at
				FROM shardgate_range_move m ORDER BY m.lo`)
			if err != nil {
				return err
			}
			var mv MoveStatus
			if _, err := pgx.ForEachRow(rows, []any{&mv.Range, &mv.To, &mv.Phase, &mv.MapVersion, &mv.Copied, &mv.Total, &mv.Behind, &mv.Started, &mv.Updated}, func() error {
				mv.From = s.Name
				st.Moves = append(st.Moves, mv)
				return nil
			}); err != nil {
				return err
			}
			rows, err = tx.Query(ctx, "SELECT key_range FROM shardgate_range_purge ORDER BY lo")
			if err != nil {
				return err
			}
			st.Purges, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if st.Err != nil {
			st = ShardStatus{Shard: s.Name, Err: st.Err}
		}
		out = append(out, st)
	}
	return out
}

// PrintStatus writes sts for an operator (`router shardmap status`): per shard, what it owns
// and at which version, each move out of it with its phase and progress, and the moved ranges
// it still has rows of. It returns the number of shards that could not be read.
func PrintStatus(w io.Writer, sts []ShardStatus, now time.Time) int {
	failed, moving := 0, 0
	for _, st := range sts {
		if st.Err != nil {
			failed++
			fmt.Fprintf(w, "shard %s: cannot read: %v\n", st.Shard, st.Err)
			continue
		}
		o := st.Ownership
		fmt.Fprintf(w, "shard %s: map version %d, owns %v", st.Shard, o.MapVersion, o.Ranges)
		if o.Applying > o.MapVersion {
			fmt.Fprintf(w, ", apply of version %d begun", o.Applying)
		}
		if len(o.Moving) > 0 {
			fmt.Fprintf(w, ", revoked %v (fenced until granted elsewhere)", o.Moving)
		}
		if len(o.Copied) > 0 {
			fmt.Fprintf(w, ", receiving copies of %v", o.Copied)
		}
		fmt.Fprintln(w)
		for _, mv := range st.Moves {
			moving++
			pct := 100.0
			if mv.Total > 0 {
				pct = min(100, 100*float64(mv.Copied)/float64(mv.Total))
			}
			fmt.Fprintf(w, "  moving %s to %s (map version %d): %s, %d of %d rows copied (%.0f%%), %d changes behind, began %v ago, last progress %v ago\n",
				mv.Range, mv.To, mv.MapVersion, mv.Phase, mv.Copied, mv.Total, pct, mv.Behind,
				now.Sub(mv.Started).Round(time.Second), now.Sub(mv.Updated).Round(time.Second))
		}
		for _, r := range st.Purges {
			fmt.Fprintf(w, "  deleting the rows of %s, moved away\n", r)
		}
	}
	if moving == 0 && failed == 0 {
		fmt.Fprintln(w, "no range is moving")
	}
	return failed
}

// StatusCollector exports the last Status read by a serving router (Record), so a scrape never
// touches a shard.
type StatusCollector struct {
	mu   sync.Mutex
	last []ShardStatus
}

var _ prometheus.Collector = (*StatusCollector)(nil)

var (
	movePhase = prometheus.NewDesc("shardgate_range_move_phase",
		"1 for each range being moved out of shard, in its phase (copying, catching_up, fenced).",
		[]string{"shard", "range", "to", "phase"}, nil)
	moveRows = prometheus.NewDesc("shardgate_range_move_rows",
		"Rows of a moving range: total when its copy began, and copied so far by the bulk copy.",
		[]string{"shard", "range", "to", "kind"}, nil)
	moveBehind = prometheus.NewDesc("shardgate_range_move_changes_behind",
		"Changes written in a moving range since its copy began that its new owner does not have yet (the copy lag).",
		[]string{"shard", "range", "to"}, nil)
	moveUpdated = prometheus.NewDesc("shardgate_range_move_progress_timestamp_seconds",
		"Unix time a moving range's copy last made progress; a move whose apply stopped stays where it is.",
		[]string{"shard", "range", "to"}, nil)
	purgePending = prometheus.NewDesc("shardgate_range_purge_pending",
		"Ranges moved away from the shard whose rows it has still to delete.",
		[]string{"shard"}, nil)
)

// Record keeps sts for the next scrapes. Shards that could not be read keep what was read last.
func (c *StatusCollector) Record(sts []ShardStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.last
	c.last = nil
	for _, st := range sts {
		if st.Err != nil {
			if i := slices.IndexFunc(prev, func(p ShardStatus) bool { return p.Shard == st.Shard }); i >= 0 {
				st = prev[i]
			} else {
				continue
			}
		}
		c.last = append(c.last, st)
	}
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{movePhase, moveRows, moveBehind, moveUpdated, purgePending} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.last {
		ch <- prometheus.MustNewConstMetric(purgePending, prometheus.GaugeValue, float64(len(st.Purges)), st.Shard)
		for _, mv := range st.Moves {
			ch <- prometheus.MustNewConstMetric(movePhase, prometheus.GaugeValue, 1, st.Shard, mv.Range, mv.To, mv.Phase)
			ch <- prometheus.MustNewConstMetric(moveRows, prometheus.GaugeValue, float64(mv.Total), st.Shard, mv.Range, mv.To, "total")
			ch <- prometheus.MustNewConstMetric(moveRows, prometheus.GaugeValue, float64(mv.Copied), st.Shard, mv.Range, mv.To, "copied")
			ch <- prometheus.MustNewConstMetric(moveBehind, prometheus.GaugeValue, float64(mv.Behind), st.Shard, mv.Range, mv.To)
			ch <- prometheus.MustNewConstMetric(moveUpdated, prometheus.GaugeValue, float64(mv.Updated.UnixNano())/1e9, st.Shard, mv.Range, mv.To)
		}
	}
}

// EstimateRate is the copy rate, in rows per second (records, ledger rows and owed credits),
// that --dry-run estimates a move's time with: a conservative figure, below what the bulk copy
// managed on a 2-core machine with load running (16,000 to 32,000 rows/s, docs/operations.md).
const EstimateRate = 10000

// Estimate is how long the bulk copy of mv (as Plan counted it) should take at EstimateRate,
// paced at pace (Options.Pace): (1+pace) times as long as unpaced.
func Estimate(mv MoveReport, pace float64) time.Duration {
	rows := mv.Records + mv.Ledger + mv.Credits
	return time.Duration((1 + max(pace, 0)) * float64(rows) / EstimateRate * float64(time.Second)).Round(time.Second)
}
