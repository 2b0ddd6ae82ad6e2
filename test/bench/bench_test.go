// Package bench measures what the router costs on top of PostgreSQL and on top of HTTP. In one
// run, on one machine and one durable PostgreSQL, it measures at each concurrency (1, 8, 64 and
// 256 by default) the transfers per second of
//
//   - anchor: pgbench on the plain one-statement CTE (testdata/anchor.sql), one commit per
//     transfer, on an unpartitioned key table and ledger of its own (schema anchor);
//   - function: pgbench on the per-item function the router calls (testdata/transfer_new.sql);
//   - router new and router replay: the router, built by service.New and served over real
//     HTTP/TCP, under the in-process load generator, with new keys and with replays;
//   - router cross new: the router on new keys whose src and dst live on two shards (a database
//     of the same PostgreSQL and one of a second server, under a map of their own), its relay
//     delivering the credits;
//   - floor: a bare net/http handler that decodes the same body and writes the router's 201,
//     under the same load generator: what HTTP alone costs here;
//   - peer new: a plain net/http + pgx service on one database, one five-statement transaction
//     per transfer (peerHandler), under the same load generator;
//
// and prints them as one table with the ratios router-new/anchor, router-replay/floor,
// cross/same and same/peer; per concurrency the p50 and p99 latency on new keys of the router
// (same and cross shard) and of the peer, the cross-shard time to credit (p50, p99) and commits
// per cross-shard transfer over both shards; and the router's p50 and p99 latency on new keys at
// concurrency 1 and 8 with group commit on and off:
//
//	go test ./test/bench -run '^$' -bench . -benchtime 1x
//	go test ./test/bench -run '^$' -bench . -benchtime 1x -args -bench.duration 5s -bench.concurrency 8,64 -bench.rounds 2
//
// Each parameter is also read from the environment (see the flags). Every phase checks the rows
// it wrote: each new-key transfer two ledger rows and one idempotency record, each replay none,
// each anchor transaction one row in its ledger and one in its key table, each cross-shard
// transfer a debit on its source, a credit on the other shard once delivered and one record, each
// peer transfer two ledger rows and one key. Absolute numbers
// depend on the machine and on whatever else runs on it; nothing here asserts a throughput,
// since a timed assertion would flake.
package bench

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/internal/localpg"
)

// The parameters, each a flag or, when the flag is not given, an environment variable.
var (
	paramDuration = newParam("bench.duration", "SHARDGATE_BENCH_DURATION", "3s",
		"length of each phase, whole seconds")
	paramRounds = newParam("bench.rounds", "SHARDGATE_BENCH_ROUNDS", "1",
		"how many times every phase runs; odd rounds run a concurrency's phases in reverse order")
	paramConcurrency = newParam("bench.concurrency", "SHARDGATE_BENCH_CONCURRENCY", "1,8,64,256",
		"concurrencies to measure: pgbench clients, load generator workers")
	paramLatency = newParam("bench.latency", "SHARDGATE_BENCH_LATENCY", "1,8",
		"concurrencies, among -bench.concurrency, at which the router's latency is measured with group commit on and off; empty for none")
	paramAged = newParam("bench.aged", "SHARDGATE_BENCH_AGED", "0",
		"days every shard has run: it holds an idempotency_record partition for each day before today (29: an aged shard at the default retention)")
	paramStatements = newParam("bench.statements", "SHARDGATE_BENCH_STATEMENTS", "0",
		"print, after each phase of the same, cross and peer rows, the N statements PostgreSQL spent the most time on, per transfer (pg_stat_statements; 0: none)")
	paramRows = newParam("bench.rows", "SHARDGATE_BENCH_ROWS", "all",
		"the rows to measure: all, or a list of "+strings.Join(rowNames[:], ",")+" (off: group commit off, at the -bench.latency concurrencies)")
)

const (
	// maxAged is a year of daily partitions, more than any retention the router accepts needs.
	maxAged = 366
	// maxStatements bounds -bench.statements to what a terminal shows.
	maxStatements = 100
	// maxConcurrency keeps a client id within the 1024 that transfer_new.sql's keys encode.
	maxConcurrency = 500
	// maxLevels and maxRounds keep the runs of transfer_new.sql, each starting its count
	// runStride past the previous one, within permute's 2^40.
	maxLevels = 16
	maxRounds = 100
	runStride = 1 << 24
)

// settings are the benchmark's parameters after flags and environment.
type settings struct {
	duration    time.Duration // of one phase
	rounds      int
	concurrency []int // ascending
	latency     []int // ascending, a subset of concurrency
	rows        []row // measured, in table order
	aged        int   // days of record partitions before today on every shard
	statements  int   // statements to print per phase (0: none)
}

// param is a benchmark parameter: a flag, else an environment variable, else the default.
type param struct {
	name, env string
	flag      *string
}

func newParam(name, env, def, usage string) param {
	return param{name: name, env: env, flag: flag.String(name, def, usage+" (or $"+env+")")}
}

// get returns the parameter's text: its flag's if given on the command line, else its
// environment variable's if set, else the flag's default; and where it came from, for error
// messages.
func (p param) get(given map[string]bool) (value, source string) {
	if v := os.Getenv(p.env); v != "" && !given[p.name] {
		return v, "$" + p.env
	}
	return *p.flag, "-" + p.name
}

// loadSettings reads and checks every parameter, reporting the first that is wrong.
func loadSettings() (settings, error) {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var s settings
	v, src := paramDuration.get(given)
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second || d%time.Second != 0 {
		return s, fmt.Errorf("%s %q: a phase lasts a whole number of seconds, at least 1s (pgbench -T takes seconds), e.g. 3s", src, v)
	}
	s.duration = d
	v, src = paramRounds.get(given)
	if s.rounds, err = strconv.Atoi(v); err != nil || s.rounds < 1 || s.rounds > maxRounds {
		return s, fmt.Errorf("%s %q: rounds must be a whole number from 1 to %d", src, v, maxRounds)
	}
	v, src = paramConcurrency.get(given)
	if s.concurrency, err = parseLevels(v); err != nil {
		return s, fmt.Errorf("%s %q: %w", src, v, err)
	}
	if len(s.concurrency) == 0 {
		return s, fmt.Errorf("%s: name at least one concurrency, e.g. 1,8,64,256", src)
	}
	v, src = paramLatency.get(given)
	if s.latency, err = parseLevels(v); err != nil {
		return s, fmt.Errorf("%s %q: %w", src, v, err)
	}
	for _, c := range s.latency {
		if !slices.Contains(s.concurrency, c) {
			return s, fmt.Errorf("%s: concurrency %d is not among -bench.concurrency %v: add it there or drop it here", src, c, s.concurrency)
		}
	}
	v, src = paramRows.get(given)
	if s.rows, err = parseRows(v); err != nil {
		return s, fmt.Errorf("%s %q: %w", src, v, err)
	}
	v, src = paramAged.get(given)
	if s.aged, err = strconv.Atoi(v); err != nil || s.aged < 0 || s.aged > maxAged {
		return s, fmt.Errorf("%s %q: days must be a whole number from 0 to %d", src, v, maxAged)
	}
	v, src = paramStatements.get(given)
	if s.statements, err = strconv.Atoi(v); err != nil || s.statements < 0 || s.statements > maxStatements {
		return s, fmt.Errorf("%s %q: statements must be a whole number from 0 to %d", src, v, maxStatements)
	}
	return s, nil
}

// parseRows reads a list of row names, or all.
func parseRows(list string) ([]row, error) {
	if list == "all" {
		rows := make([]row, numRows)
		for r := range numRows {
			rows[r] = r
		}
		return rows, nil
	}
	var rows []row
	for name := range strings.SplitSeq(list, ",") {
		i := slices.Index(rowNames[:], strings.TrimSpace(name))
		if i < 0 {
			return nil, fmt.Errorf("no row %q: name all, or some of %s", name, strings.Join(rowNames[:], ","))
		}
		if !slices.Contains(rows, row(i)) {
			rows = append(rows, row(i))
		}
	}
	slices.Sort(rows)
	return rows, nil
}

// parseLevels parses a comma-separated list of distinct concurrencies and sorts it.
func parseLevels(list string) ([]int, error) {
	var levels []int
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		c, err := strconv.Atoi(f)
		if err != nil || c < 1 || c > maxConcurrency {
			return nil, fmt.Errorf("concurrency %q must be a whole number from 1 to %d", f, maxConcurrency)
		}
		if slices.Contains(levels, c) {
			return nil, fmt.Errorf("concurrency %d is listed twice", c)
		}
		levels = append(levels, c)
	}
	if len(levels) > maxLevels {
		return nil, fmt.Errorf("%d concurrencies: at most %d", len(levels), maxLevels)
	}
	slices.Sort(levels)
	return levels, nil
}

// BenchmarkTransfers runs every phase once per round, whatever b.N is: each phase is timed by
// its duration, not by a number of iterations.
func BenchmarkTransfers(b *testing.B) {
	s, err := loadSettings()
	if err != nil {
		b.Fatal(err)
	}
	serverBin, err := localpg.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	pgbenchBin, err := findPgbench(serverBin)
	if err != nil {
		b.Fatal(err)
	}
	phases := 0
	for _, c := range s.concurrency {
		phases += len(phasesAt(c, s))
	}
	// Each level warms two routers and the peer up; its cross-shard phase has a router of its
	// own, warmed up too, and waits for its credits and its connections to close.
	budget := time.Duration(s.rounds) * (time.Duration(phases)*(s.duration+2*time.Second) + time.Duration(len(s.concurrency))*(4*warmup+10*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), budget+5*time.Minute)
	defer cancel()

	f := setup(ctx, b, s, pgbenchBin)
	res := make(results, len(s.concurrency))
	for round := range s.rounds {
		for i, c := range s.concurrency {
			f.runLevel(ctx, b, s, round, c, &res[i])
		}
	}
	fmt.Print(report(f, s, res))
}

// row is one line of the throughput table, and what the phase measuring it must write.
type row int

const (
	anchorRow row = iota
	functionRow
	routerNewRow
	// crossNewRow is the router on new keys whose src and dst live on two shards.
	crossNewRow
	routerReplayRow
	floorRow
	// peerRow is the hand-written one-database service (peerHandler) on new keys.
	peerRow
	// routerOffRow is the router on new keys with group commit off, measured only at the
	// latency concurrencies; it is reported in the latency table.
	routerOffRow
	numRows
)

func (r row) String() string {
	return [...]string{"anchor CTE", "function", "router new", "router cross new", "router replay", "floor", "peer new", "router new, group commit off"}[r]
}

// rowNames name the rows in -bench.rows.
var rowNames = [numRows]string{"anchor", "function", "same", "cross", "replay", "floor", "peer", "off"}

// phasesAt lists the rows measured at concurrency c, in the order a round measures them.
func phasesAt(c int, s settings) []row {
	rows := []row{anchorRow, functionRow, routerNewRow, crossNewRow, routerReplayRow, floorRow, peerRow}
	if slices.Contains(s.latency, c) {
		rows = slices.Insert(rows, 3, routerOffRow)
	}
	return slices.DeleteFunc(rows, func(r row) bool { return !slices.Contains(s.rows, r) })
}

// results holds, per concurrency, what each row measured over all rounds.
type results [][numRows]measurement

// measurement is what one row measured in one or more phases.
type measurement struct {
	txns      int64
	elapsed   time.Duration   // pgbench's excludes connecting, as its tps does
	latencies []time.Duration // of each request, sorted; load generator phases only
	groups    groupStats      // the router's groups in the phase; router on new keys only
	credit    delays          // times to credit in the phase; cross-shard only
	// commits is what the cross shards committed over a cross-shard router's life, committed
	// the transfers it created meanwhile (its warm-up's too); cross-shard only.
	commits, committed int64
	cpu                cpuTime // over the phase (over the cross-shard router's life, for its row)
}

func (m measurement) tps() float64 {
	if m.elapsed <= 0 {
		return 0
	}
	return float64(m.txns) / m.elapsed.Seconds()
}

func (m *measurement) add(o measurement) {
	m.txns += o.txns
	m.elapsed += o.elapsed
	m.groups = m.groups.plus(o.groups)
	m.credit = m.credit.plus(o.credit)
	m.commits += o.commits
	m.committed += o.committed
	m.cpu = m.cpu.plus(o.cpu)
	if len(o.latencies) > 0 {
		m.latencies = append(m.latencies, o.latencies...)
		slices.Sort(m.latencies)
	}
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted, or 0 if it is empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// report formats the results as one table, with the machine and the settings above it.
func report(f *fixture, s settings, res results) string {
	var out strings.Builder
	fmt.Fprintf(&out, "\nmachine: %d cores, GOMAXPROCS %d; PostgreSQL %s, %s, max_connections %d\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), f.pgVersion, f.durability, f.maxConns)
	fmt.Fprintf(&out, "phases: %d round(s) of %v each; every figure is transfers/s; every phase checked the rows it wrote\n",
		s.rounds, s.duration)
	fmt.Fprintf(&out, "anchor: pgbench, one-statement CTE, unpartitioned tables; function: pgbench, shardgate_apply_rows (one debit + its same-shard credit);\n"+
		"  floor: bare net/http handler decoding the same body and writing the same 201, same load generator\n")
	fmt.Fprintf(&out, "router cross new: src and dst on two shards, half the keyspace each, one on this PostgreSQL and one on a second server, relay running;\n"+
		"  peer: net/http + pgx on one database, one transaction of five statements, pool as large as the router's\n")
	fmt.Fprintf(&out, "router: service.New, auth none, shard_pool max_conns=min(c,%d) max_waiting=%d (so that c > %d queue for\n"+
		"  a connection instead of getting 503 shard-busy), group_commit max_batch=%d (on; in_flight %d, stall_after %v) unless off (=%d)\n",
		routerMaxConns, routerMaxWaiting, routerMaxConns, groupCommitOn, f.base.GroupCommit.InFlight, f.base.GroupCommit.StallAfter, groupCommitOff)
	const label = "%-18s" // as wide as "group commit off" and a gap
	fmt.Fprintf(&out, label, "transfers/s")
	for _, c := range s.concurrency {
		fmt.Fprintf(&out, "%10s", "c="+strconv.Itoa(c))
	}
	out.WriteByte('\n')
	for r := range routerOffRow {
		fmt.Fprintf(&out, label, r)
		for i := range s.concurrency {
			fmt.Fprintf(&out, "%10.0f", res[i][r].tps())
		}
		out.WriteByte('\n')
	}
	for _, q := range []struct {
		name     string
		num, den row
	}{{"router/anchor", routerNewRow, anchorRow}, {"replay/floor", routerReplayRow, floorRow},
		{"cross/same", crossNewRow, routerNewRow}, {"same/peer", routerNewRow, peerRow}} {
		fmt.Fprintf(&out, label, q.name)
		for i := range s.concurrency {
			fmt.Fprintf(&out, "%10s", ratio(res[i][q.num], res[i][q.den]))
		}
		out.WriteByte('\n')
	}
	out.WriteString(groupLines(s, res, label))
	out.WriteString(newKeyLines(s, res, label))
	if len(s.latency) > 0 {
		out.WriteString(latencyTable(s, res, label))
	}
	return out.String()
}

// groupLines formats how the router on new keys grouped its transfers: the mean group size, the
// share of groups that stalled (in flight longer than group_commit.stall_after), and where a
// transfer's time went, per transfer: waiting to join a group, then in its group's statement and
// commit; the rest of its latency is HTTP, the handler and the load generator.
func groupLines(s settings, res results, label string) string {
	var out strings.Builder
	for _, line := range []struct {
		name string
		cell func(g groupStats) string
	}{
		{"mean group", func(g groupStats) string { return fmt.Sprintf("%.1f", g.items/g.groups) }},
		{"stalled groups", func(g groupStats) string { return fmt.Sprintf("%.2f%%", 100*g.stalls/g.groups) }},
		{"ms to join group", func(g groupStats) string { return fmt.Sprintf("%.3f", 1000*g.waited/g.items) }},
		{"ms in group", func(g groupStats) string { return fmt.Sprintf("%.3f", 1000*(g.onShard-g.waited)/g.items) }},
	} {
		fmt.Fprintf(&out, label, line.name)
		for i := range s.concurrency {
			cell := "n/a"
			if g := res[i][routerNewRow].groups; g.groups > 0 {
				cell = line.cell(g)
			}
			fmt.Fprintf(&out, "%10s", cell)
		}
		out.WriteByte('\n')
	}
	return out.String()
}

// newKeyLines formats, per concurrency, the latency on new keys of the router with src and dst on
// one shard, with them on two, and of the peer; a cross-shard transfer's time to credit (from its
// debit's commit until its credit is in dst's ledger, as the relay's histogram
// shardgate_credit_delay_seconds estimates it); and the commits per cross-shard transfer summed
// over both shards.
func newKeyLines(s settings, res results, label string) string {
	var out strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
	latency := func(r row, p float64) func(m [numRows]measurement) string {
		return func(m [numRows]measurement) string {
			if len(m[r].latencies) == 0 {
				return "n/a"
			}
			return ms(percentile(m[r].latencies, p))
		}
	}
	credit := func(p float64) func(m [numRows]measurement) string {
		return func(m [numRows]measurement) string {
			if d, ok := m[crossNewRow].credit.quantile(p); ok {
				return ms(d)
			}
			return "n/a"
		}
	}
	for _, line := range []struct {
		name string
		cell func(m [numRows]measurement) string
	}{
		{"same p50 ms", latency(routerNewRow, 0.50)},
		{"same p99 ms", latency(routerNewRow, 0.99)},
		{"cross p50 ms", latency(crossNewRow, 0.50)},
		{"cross p99 ms", latency(crossNewRow, 0.99)},
		{"peer p50 ms", latency(peerRow, 0.50)},
		{"peer p99 ms", latency(peerRow, 0.99)},
		{"credit p50 ms", credit(0.50)},
		{"credit p99 ms", credit(0.99)},
		{"same cpu us/t", cpuPer(routerNewRow)},
		{"cross cpu us/t", cpuPer(crossNewRow)},
		{"peer cpu us/t", cpuPer(peerRow)},
		{"cross commits/t", func(m [numRows]measurement) string {
			if m[crossNewRow].committed == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", float64(m[crossNewRow].commits)/float64(m[crossNewRow].committed))
		}},
	} {
		fmt.Fprintf(&out, label, line.name)
		for i := range s.concurrency {
			fmt.Fprintf(&out, "%10s", line.cell(res[i]))
		}
		out.WriteByte('\n')
	}
	return out.String()
}

// cpuPer formats row r's CPU time per transfer, in µs, as "this process+PostgreSQL"; for the
// cross-shard row over every transfer of its router's life (warm-up included).
func cpuPer(r row) func(m [numRows]measurement) string {
	return func(m [numRows]measurement) string {
		n := m[r].txns
		if r == crossNewRow {
			n = m[r].committed
		}
		if n == 0 {
			return "n/a"
		}
		us := func(d time.Duration) int64 { return d.Microseconds() / n }
		return fmt.Sprintf("%d+%d", us(m[r].cpu.self), us(m[r].cpu.pg))
	}
}

func ratio(num, den measurement) string {
	if den.tps() == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", num.tps()/den.tps())
}

// latencyTable formats the router's latency on new keys, with group commit on and off, and its
// throughput in those phases.
func latencyTable(s settings, res results, label string) string {
	var out strings.Builder
	fmt.Fprintf(&out, label, "router latency ms")
	for _, c := range s.latency {
		for _, col := range []string{"p50", "p99", "tps"} {
			fmt.Fprintf(&out, "%10s", col+" c="+strconv.Itoa(c))
		}
	}
	out.WriteByte('\n')
	for _, r := range []struct {
		name string
		row  row
	}{{"group commit on", routerNewRow}, {"group commit off", routerOffRow}} {
		fmt.Fprintf(&out, label, r.name)
		for _, c := range s.latency {
			m := res[slices.Index(s.concurrency, c)][r.row]
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			fmt.Fprintf(&out, "%10.2f%10.2f%10.0f", ms(percentile(m.latencies, 0.50)), ms(percentile(m.latencies, 0.99)), m.tps())
		}
		out.WriteByte('\n')
	}
	return out.String()
}

func TestParseLevels(t *testing.T) {
	tests := []struct {
		list    string
		want    []int
		wantErr string
	}{
		{"1,8,64,256", []int{1, 8, 64, 256}, ""},
		{" 64, 8 ,1", []int{1, 8, 64}, ""},
		{"", nil, ""},
		{"8,", []int{8}, ""},
		{"0", nil, "from 1 to 500"},
		{"501", nil, "from 1 to 500"},
		{"eight", nil, "whole number"},
		{"8,1,8", nil, "listed twice"},
		{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", nil, "at most 16"},
	}
	for _, tt := range tests {
		got, err := parseLevels(tt.list)
		if tt.wantErr == "" && err != nil {
			t.Errorf("parseLevels(%q): %v", tt.list, err)
		}
		if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("parseLevels(%q) error = %v, want one mentioning %q", tt.list, err, tt.wantErr)
		}
		if err == nil && !slices.Equal(got, tt.want) {
			t.Errorf("parseLevels(%q) = %v, want %v", tt.list, got, tt.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", []time.Duration{7}, 0.99, 7},
		{"median of two is the lower", []time.Duration{1, 2}, 0.5, 1},
		{"p50 of 100", hundred, 0.50, 50},
		{"p99 of 100", hundred, 0.99, 99},
		{"p100 of 100", hundred, 1, 100},
		{"p99 of 3 is the max", []time.Duration{1, 2, 3}, 0.99, 3},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

func TestLoadSettingsFromEnvironment(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    settings
		wantErr string
	}{
		{nil, settings{3 * time.Second, 1, []int{1, 8, 64, 256}, []int{1, 8}, nil, 0, 0}, ""},
		{map[string]string{"SHARDGATE_BENCH_DURATION": "2s", "SHARDGATE_BENCH_CONCURRENCY": "16,4"},
			settings{}, "-bench.latency: concurrency 1 is not among"},
		{map[string]string{"SHARDGATE_BENCH_DURATION": "2s", "SHARDGATE_BENCH_CONCURRENCY": "16,4", "SHARDGATE_BENCH_LATENCY": ","},
			settings{2 * time.Second, 1, []int{4, 16}, nil, nil, 0, 0}, ""},
		{map[string]string{"SHARDGATE_BENCH_DURATION": "1500ms"}, settings{}, "whole number of seconds"},
		{map[string]string{"SHARDGATE_BENCH_ROUNDS": "0"}, settings{}, "from 1 to 100"},
		{map[string]string{"SHARDGATE_BENCH_LATENCY": "1,16"}, settings{}, "16 is not among"},
		{map[string]string{"SHARDGATE_BENCH_CONCURRENCY": "8", "SHARDGATE_BENCH_LATENCY": "8"},
			settings{3 * time.Second, 1, []int{8}, []int{8}, nil, 0, 0}, ""},
		{map[string]string{"SHARDGATE_BENCH_ROWS": "cross,same,peer"}, settings{3 * time.Second, 1, []int{1, 8, 64, 256}, []int{1, 8}, []row{routerNewRow, crossNewRow, peerRow}, 0, 0}, ""},
		{map[string]string{"SHARDGATE_BENCH_ROWS": "same,crosss"}, settings{}, `no row "crosss"`},
		{map[string]string{"SHARDGATE_BENCH_AGED": "29"}, settings{3 * time.Second, 1, []int{1, 8, 64, 256}, []int{1, 8}, nil, 29, 0}, ""},
		{map[string]string{"SHARDGATE_BENCH_AGED": "-1"}, settings{}, "days must be a whole number from 0 to 366"},
		{map[string]string{"SHARDGATE_BENCH_STATEMENTS": "12"}, settings{3 * time.Second, 1, []int{1, 8, 64, 256}, []int{1, 8}, nil, 0, 12}, ""},
		{map[string]string{"SHARDGATE_BENCH_STATEMENTS": "many"}, settings{}, "statements must be a whole number from 0 to 100"},
	}
	for _, tt := range tests {
		for k, v := range tt.env {
			t.Setenv(k, v)
		}
		got, err := loadSettings()
		for k := range tt.env {
			t.Setenv(k, "")
		}
		if tt.wantErr == "" && err != nil {
			t.Errorf("%v: %v", tt.env, err)
			continue
		}
		if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%v: error = %v, want one mentioning %q", tt.env, err, tt.wantErr)
			continue
		}
		if err == nil && (got.duration != tt.want.duration || got.rounds != tt.want.rounds ||
			!slices.Equal(got.concurrency, tt.want.concurrency) || !slices.Equal(got.latency, tt.want.latency) ||
			tt.want.rows != nil && !slices.Equal(got.rows, tt.want.rows) || got.aged != tt.want.aged || got.statements != tt.want.statements) {
			t.Errorf("%v: settings %+v, want %+v", tt.env, got, tt.want)
		}
	}
}
