package rangemove

import (
	"context"
	"testing"

	"github.com/shardgate/shardgate/partition"
)

// captureTriggers counts the change-capture triggers on shard's three tables.
func (c *cluster) captureTriggers(shard string) int {
	c.t.Helper()
	var n int
	if err := c.pool(shard).QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger
		WHERE tgname LIKE 'shardgate_capture_change%'`).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// A shard carries the change-capture triggers only while a range moves out of it: none before
// the move, all four on the source from its start through the catch-up, none on either shard
// once the move is settled.
func TestCaptureTriggersOnlyDuringMove(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	reqs := c.seedRange(0, 600)
	if a, b := c.captureTriggers("sa"), c.captureTriggers("sb"); a+b != 0 {
		t.Fatalf("before the move: %d capture triggers on sa, %d on sb, want none", a, b)
	}
	during := map[string]int{}
	testHook = func(point string) {
		if _, seen := during[point]; !seen && (point == "copy" || point == "catch-up") {
			during[point] = c.captureTriggers("sa")
		}
	}
	defer func() { testHook = nil }()
	if _, err := Apply(context.Background(), c.mapOf(2, "sa=-40 sb=40-"), c.pool, Options{Interval: partition.Daily}); err != nil {
		t.Fatal(err)
	}
	testHook = nil
	if during["copy"] != 4 || during["catch-up"] != 4 {
		t.Errorf("capture triggers on sa during the copy %d, during the catch-up %d, want 4 and 4", during["copy"], during["catch-up"])
	}
	if a, b := c.captureTriggers("sa"), c.captureTriggers("sb"); a+b != 0 {
		t.Errorf("after the move: %d capture triggers on sa, %d on sb, want none", a, b)
	}
	c.checkMoved(reqs)
}
