package rangemove

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
)

// benchCluster gives the bench its shards sa and sb, and names one shard of each PostgreSQL
// server they are on. Unless SHARDGATE_BENCH_MOVE_SERVERS is 1, each shard is a server of its
// own, as shards on separate machines are: fsync on (SHARDGATE_BENCH_MOVE_FSYNC=off turns it
// off), and SHARDGATE_PG_SETTINGS over localpg's defaults. With 1 they are two databases of the
// tests' server (fsync off), sharing its WAL, buffers and checkpoints.
func benchCluster(t *testing.T) (*cluster, []string) {
	t.Helper()
	if os.Getenv("SHARDGATE_BENCH_MOVE_SERVERS") == "1" {
		fmt.Println("shards: two databases of one PostgreSQL server, fsync off")
		return newCluster(t, "sa", "sb"), []string{"sa"}
	}
	settings, err := pgtest.Settings()
	if err != nil {
		t.Fatalf("SHARDGATE_PG_SETTINGS: %v", err)
	}
	durable := os.Getenv("SHARDGATE_BENCH_MOVE_FSYNC") != "off"
	fmt.Printf("shards: one PostgreSQL server each, fsync %s, settings %v\n", map[bool]string{true: "on", false: "off"}[durable], settings)
	return &cluster{t: t, pools: shardtest.OnServers(t, localpg.Options{Durable: durable, Settings: settings}, "sa", "sb")}, []string{"sa", "sb"}
}

// waitSampler samples, every waitEvery, what the active backends of the shards' databases are
// doing (on CPU, or waiting, and on what), the router's apart from the others (the apply's):
// where a transfer's time goes while a range moves.
type waitSampler struct {
	halt chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	samples []waitSample
}

const waitEvery = 100 * time.Millisecond

// waitSample is the backends of one shard doing one thing at one moment.
type waitSample struct {
	at               time.Time
	shard, who, what string
	n                int
}

// sampleWaits samples the shards' backends until stop.
func sampleWaits(c *cluster, shards ...string) *waitSampler {
	w := &waitSampler{halt: make(chan struct{})}
	for _, shard := range shards {
		pool := c.pool(shard)
		w.wg.Go(func() {
			tick := time.NewTicker(waitEvery)
			defer tick.Stop()
			for {
				select {
				case <-w.halt:
					return
				case at := <-tick.C:
					rows, err := pool.Query(context.Background(), `SELECT CASE WHEN application_name = 'shardgate' THEN 'router' ELSE 'apply' END,
						coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)
						FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend'
						  AND pid <> pg_backend_pid() AND datname = current_database() GROUP BY 1, 2`)
					if err != nil {
						continue // the sample is lost; the bench goes on
					}
					for rows.Next() {
						s := waitSample{at: at, shard: shard}
						if rows.Scan(&s.who, &s.what, &s.n) == nil {
							w.mu.Lock()
							w.samples = append(w.samples, s)
							w.mu.Unlock()
						}
					}
					rows.Close()
				}
			}
		})
	}
	return w
}

// stop ends the sampling; it may be called more than once.
func (w *waitSampler) stop() {
	select {
	case <-w.halt:
	default:
		close(w.halt)
	}
	w.wg.Wait()
}

// report prints, for the time before the move (from before to moveStart) and during it, the
// average number of backends of each shard doing each thing, the largest first.
func (w *waitSampler) report(before, moveStart, moveEnd time.Time) {
	w.stop()
	for _, span := range []struct {
		name     string
		from, to time.Time
	}{{"before the move", before, moveStart}, {"during the move", moveStart, moveEnd}} {
		ticks := float64(span.to.Sub(span.from) / waitEvery)
		sums := map[string]int{}
		for _, s := range w.samples {
			if !s.at.Before(span.from) && s.at.Before(span.to) {
				sums[s.shard+" "+s.who+" "+s.what] += s.n
			}
		}
		keys := make([]string, 0, len(sums))
		for k := range sums {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(sums[b], sums[a]) })
		var parts []string
		for _, k := range keys[:min(len(keys), 10)] {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(sums[k])/max(ticks, 1)))
		}
		fmt.Printf("  active backends %s (average): %s\n", span.name, strings.Join(parts, ", "))
	}
}

// appliedMove is what `router shardmap apply` said of the bench's move.
type appliedMove struct {
	granted                  time.Time // when it printed the grant
	records, ledger, credits int64     // the rows it copied
}

// applyCommand moves the range as an operator does, with `router shardmap apply --map next`
// run as a process of its own (built from ../cmd/router, or SHARDGATE_BENCH_MOVE_ROUTER), at
// pace, over a router.yaml naming mapPath: it puts next in place of mapPath once the range is
// fenced, and the bench's router finds it through the old owner's refusal. It prints the
// command's output, calls onGrant when it reports the grant, and fails the test unless the
// command succeeds.
func applyCommand(t *testing.T, mapPath, next string, pace float64, onGrant func()) appliedMove {
	t.Helper()
	dir := filepath.Dir(mapPath)
	bin := os.Getenv("SHARDGATE_BENCH_MOVE_ROUTER")
	if bin == "" {
		bin = filepath.Join(dir, "router")
		if out, err := exec.Command("go", "build", "-o", bin, "../cmd/router").CombinedOutput(); err != nil {
			t.Fatalf("build the router: %v\n%s", err, out)
		}
	}
	cfg := filepath.Join(dir, "apply.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "shardmap: %s\nauth:\n  mode: none\nrange_moves:\n  pace: %g\n", mapPath, pace), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{bin, "shardmap", "apply", "-config", cfg, "-map", next}
	if n := os.Getenv("SHARDGATE_BENCH_MOVE_NICE"); n != "" {
		args = append([]string{"nice", "-n", n}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "PGAPPNAME=shardgate-apply") // its backends apart from the router's in sampleWaits
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mv appliedMove
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		line := lines.Text()
		fmt.Printf("  %s\n", line)
		switch {
		case strings.Contains(line, "granted after a fence"):
			mv.granted = time.Now()
			onGrant()
		case strings.HasPrefix(line, "moved rows of "):
			var r, from, to string
			if _, err := fmt.Sscanf(line, "moved rows of %s from %s to %s %d idempotency records, %d ledger rows, %d owed credits",
				&r, &from, &to, &mv.records, &mv.ledger, &mv.credits); err != nil {
				t.Errorf("apply said %q: %v", line, err)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("router shardmap apply: %v", err)
	}
	if mv.granted.IsZero() || mv.records == 0 {
		t.Fatal("router shardmap apply did not report the grant and the rows it moved")
	}
	return mv
}

// histSnap is the router's histograms for one shard at one moment: cumulative counts by upper
// bound, and the count, of each histogram by name (all outcomes summed).
type histSnap map[string]map[float64]uint64

// routerHistograms snapshots the router's round-trip and group-commit histograms for shard.
func routerHistograms(t *testing.T, reg *prometheus.Registry, shard string) histSnap {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := histSnap{}
	for _, mf := range mfs {
		name := mf.GetName()
		if name != "shardgate_shard_request_duration_seconds" && name != "shardgate_group_commit_wait_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "shard" && l.GetValue() == shard }) {
				continue
			}
			if out[name] == nil {
				out[name] = map[float64]uint64{}
			}
			h := m.GetHistogram()
			for _, b := range h.GetBucket() {
				out[name][b.GetUpperBound()] += b.GetCumulativeCount()
			}
			out[name][math.Inf(1)] += h.GetSampleCount()
		}
	}
	return out
}

// tails says, of what the histograms counted from a to b, the share above each of bounds.
func tails(a, b histSnap, name string, bounds ...float64) string {
	total := b[name][math.Inf(1)] - a[name][math.Inf(1)]
	if total == 0 {
		return "none"
	}
	var parts []string
	for _, le := range bounds {
		over := total - (b[name][le] - a[name][le])
		parts = append(parts, fmt.Sprintf(">%gms %.2f%%", le*1000, 100*float64(over)/float64(total)))
	}
	return fmt.Sprintf("%d, %s", total, strings.Join(parts, " "))
}

// niceApply, while ctx lasts, gives the shards' backends of the apply (application_name
// shardgate-apply) the nice value SHARDGATE_BENCH_MOVE_NICE, if set, once a second.
func niceApply(ctx context.Context, c *cluster) {
	n, err := strconv.Atoi(os.Getenv("SHARDGATE_BENCH_MOVE_NICE"))
	if err != nil {
		return
	}
	go func() {
		for ctx.Err() == nil {
			for _, shard := range []string{"sa", "sb"} {
				rows, err := c.pool(shard).Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = 'shardgate-apply'")
				if err != nil {
					continue
				}
				pids, _ := pgx.CollectRows(rows, pgx.RowTo[int32])
				for _, pid := range pids {
					syscall.Setpriority(syscall.PRIO_PROCESS, int(pid), n) //nolint:errcheck // an experiment
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// experiments runs, before the move (and before the time before it), the experiments the
// environment asks for, each for its duration after beforeMove of load alone, printing the other
// range's p99 in that time against the beforeMove before it:
// SHARDGATE_BENCH_MOVE_CAPTURE lists the move of 40-80 on sa with nothing copied, so its change
// capture runs alone; SHARDGATE_BENCH_MOVE_BURN keeps one core busy with a loop at nice 19,
// a process that shares nothing with the shards but the machine.
func experiments(t *testing.T, c *cluster, l *benchLoad) {
	ctx := context.Background()
	lo, hi := idem.Bounds(mustRange(t, "40-80"))
	for _, e := range []struct {
		env, what   string
		start, stop func() error
	}{
		{"SHARDGATE_BENCH_MOVE_CAPTURE", "change capture alone", func() error {
			_, err := c.pool("sa").Exec(ctx, "INSERT INTO shardgate_range_move (lo, hi, key_range, dst, map_version, rows_total) VALUES ($1, $2, '40-80', 'sb', 2, 0)", lo, hi)
			return err
		}, func() error {
			for _, q := range []string{"DELETE FROM shardgate_range_move", "DELETE FROM shardgate_range_change"} {
				if _, err := c.pool("sa").Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := idem.DropIdleCapture(ctx, c.pool("sa"))
			return err
		}},
		{"SHARDGATE_BENCH_MOVE_BURN", "a busy loop at nice 19", nil, nil},
	} {
		d, err := time.ParseDuration(os.Getenv(e.env))
		if err != nil || d <= 0 {
			continue
		}
		var burn *exec.Cmd
		if e.start == nil {
			burn = exec.Command("nice", "-n", "19", "sh", "-c", "while :; do :; done")
			e.start, e.stop = burn.Start, func() error { return errors.Join(burn.Process.Kill(), burn.Wait()) }
		}
		time.Sleep(beforeMove)
		start := time.Now()
		if err := e.start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d)
		end := time.Now()
		if err := e.stop(); err != nil && burn == nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		var before, during []time.Duration
		for _, s := range l.samples[false] {
			switch {
			case s.at.After(start.Add(-beforeMove)) && s.at.Before(start):
				before = append(before, s.latency)
			case s.at.After(start) && s.at.Before(end):
				during = append(during, s.latency)
			}
		}
		l.mu.Unlock()
		fmt.Printf("  %s for %v: other range p99 %v (before %v)\n", e.what, d, p99(during).Round(time.Microsecond), p99(before).Round(time.Microsecond))
	}
}
