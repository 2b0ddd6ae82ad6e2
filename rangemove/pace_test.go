package rangemove

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
)

// An apply with a pace outside 0..idem.MaxPace is refused before it changes anything.
func TestPaceRefused(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	for _, bad := range []float64{-1, idem.MaxPace + 1, math.NaN()} {
		_, err := Apply(context.Background(), c.mapOf(2, "sa=-40 sb=40-"), c.pool, Options{Interval: partition.Daily, Pace: bad})
		if err == nil || !strings.Contains(err.Error(), "must be between 0 (no pause) and 10") {
			t.Errorf("pace %v: %v, want a refusal naming the bounds", bad, err)
		}
	}
	if got := c.owned("sa"); got != "[-80] | []" {
		t.Errorf("sa owns %q after refused applies, want -80 and nothing moving", got)
	}
	// router.yaml's default is the package's.
	cfg, err := config.Parse("router.yaml", []byte("auth:\n  mode: none\n"))
	if err != nil || cfg.RangeMoves.Pace != DefaultPace {
		t.Errorf("range_moves.pace defaults to %v (%v), want DefaultPace %v", cfg.RangeMoves.Pace, err, DefaultPace)
	}
}

// A paced apply copies every row, pauses between its bulk-copy batches, and resumes from its
// cursor when stopped during the copy; the purge it runs is paced too and deletes every moved
// row from the old owner.
func TestPacedCopyResumes(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	reqs := c.seedRange(0, 1200) // three batches of records, two of ledger rows
	v2 := c.mapOf(2, "sa=-40 sb=40-")
	const pace = 2.0

	stopCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var at []time.Time
	testHook = func(point string) {
		if point == "copy" {
			if at = append(at, time.Now()); len(at) == 2 {
				cancel()
			}
		}
	}
	defer func() { testHook = nil }()
	began := time.Now()
	first, err := Apply(stopCtx, v2, c.pool, Options{Interval: partition.Daily, Pace: pace})
	testHook = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped apply: %v, want context.Canceled", err)
	}
	// The first batch took at most at[0]-began; the second waited for its pause of twice that.
	if first, gap := at[0].Sub(began), at[1].Sub(at[0]); gap < time.Duration(pace*float64(first))/4 {
		t.Errorf("batches %v apart after a first one of %v at pace %v: no pause", gap, first, pace)
	}
	var copied int64
	if err := c.pool("sa").QueryRow(ctx, "SELECT rows_copied FROM shardgate_range_move").Scan(&copied); err != nil || copied != 2*copyBatch {
		t.Fatalf("stopped after two batches with %d rows copied (%v), want %d", copied, err, 2*copyBatch)
	}
	more := c.seedRange(5000, 30)
	moves, err := Apply(ctx, v2, c.pool, Options{Interval: partition.Daily, Pace: pace})
	if err != nil {
		t.Fatal(err)
	}
	if moves[0].Records+first[0].Records > 1200+30 {
		t.Errorf("the resumed copy copied %d records after %d: it started over", moves[0].Records, first[0].Records)
	}
	c.checkMoved(append(reqs, more...))
	lo, hi := idem.Bounds(mustRange(t, "40-80"))
	var left int
	if err := c.pool("sa").QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_record WHERE `+inRange+`)
		+ (SELECT count(*) FROM ledger_entries WHERE `+inRange+`)`, lo, hi).Scan(&left); err != nil || left != 0 {
		t.Errorf("sa keeps %d rows of 40-80 after the paced purge (%v)", left, err)
	}
}

// --dry-run's estimate of the copy grows with the pace: (1+pace) times the unpaced time.
func TestEstimatePaced(t *testing.T) {
	mv := MoveReport{Records: 10000, Ledger: 19000, Credits: 1000} // 3 s at EstimateRate
	for pace, want := range map[float64]time.Duration{0: 3 * time.Second, 1: 6 * time.Second, 2.5: 10500 * time.Millisecond} {
		if got := Estimate(mv, pace); got != want.Round(time.Second) {
			t.Errorf("Estimate at pace %v = %v, want %v", pace, got, want.Round(time.Second))
		}
	}
}
