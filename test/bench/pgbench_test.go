package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// findPgbench returns the pgbench to run: the one on PATH (Debian's postgresql-client puts it
// in /usr/bin), else the one next to the server binaries.
func findPgbench(serverBin string) (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	p := filepath.Join(serverBin, "pgbench")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0 {
		return p, nil
	}
	return "", errors.New("pgbench is not on PATH nor in " + serverBin +
		": install it (apt-get install postgresql-client-15, or run scripts/ensure-deps.sh as root)")
}

// anchorSchema holds the anchor's tables (testdata/anchor_schema.sql, which
// scripts/bench-compare.sh reads too), apart from shardgate's; anchor.sql runs with it as its
// search_path.
const anchorSchema = "anchor"

// pgbench runs pgbench scripts against one server.
type pgbench struct {
	bin      string
	host     string
	port     int
	user, db string
}

// pgbenchRun is one run of a script.
type pgbenchRun struct {
	script   string // file name in testdata
	clients  int
	duration time.Duration // whole seconds
	// connecting is how long its clients are expected to take to connect. pgbench's clock (-T)
	// starts before they connect, and its tps leaves the connecting out, so -T is lengthened by
	// this, rounded up to whole seconds, to measure about duration of transfers: at c=256 on two
	// cores the connections alone can take longer than a whole short phase.
	connecting time.Duration
	vars       map[string]string // -D name=value
	searchPath string            // the connections' search_path; empty for the server's default
}

// extraSeconds is how many seconds -T adds for connecting: none for up to a tenth of a second,
// which the run may lose (pgbench's tps is a rate over what is left), else r.connecting rounded up.
func (r pgbenchRun) extraSeconds() int {
	if r.connecting <= 100*time.Millisecond {
		return 0
	}
	return int((r.connecting + time.Second - 1) / time.Second)
}

// pgbenchReport is what pgbench printed about a run.
type pgbenchReport struct {
	processed int64         // "number of transactions actually processed"
	failed    int64         // "number of failed transactions" (PostgreSQL 15+; 0 when absent)
	tps       float64       // excluding the time spent connecting
	latency   time.Duration // "latency average"
	connect   time.Duration // "initial connection time" (PostgreSQL 14+; 0 when absent)
}

// run runs pgbench to completion and returns its report. It uses a thread per core (at most
// one per client), as pgbench is meant to be run: each thread drives its share of the clients'
// connections asynchronously.
func (p pgbench) run(ctx context.Context, r pgbenchRun) (pgbenchReport, error) {
	script, err := filepath.Abs(filepath.Join("testdata", r.script))
	if err != nil {
		return pgbenchReport{}, err
	}
	args := []string{
		"-n",             // no vacuum of pgbench's own tables: we have none
		"-M", "prepared", // like pgx's statement cache: parse once per connection, then Bind/Execute
		"-c", strconv.Itoa(r.clients), "-j", strconv.Itoa(min(r.clients, runtime.NumCPU())),
		"-T", strconv.Itoa(int(r.duration/time.Second) + r.extraSeconds()),
		"-f", script,
		"-h", p.host, "-p", strconv.Itoa(p.port), "-U", p.user,
	}
	for _, name := range slices.Sorted(maps.Keys(r.vars)) {
		args = append(args, "-D", name+"="+r.vars[name])
	}
	args = append(args, p.db)
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = clientEnv()
	if r.searchPath != "" {
		cmd.Env = append(cmd.Env, "PGOPTIONS=-c search_path="+r.searchPath)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return pgbenchReport{}, fmt.Errorf("%s %s: %w\nstdout:\n%s\nstderr:\n%s", p.bin, r.script, err, stdout.String(), lastLines(stderr.String(), 20))
	}
	rep, err := parsePgbench(stdout.String())
	if err != nil {
		return rep, fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), lastLines(stderr.String(), 20))
	}
	if rep.failed > 0 {
		return rep, fmt.Errorf("pgbench reports %d failed transactions; stderr ends with:\n%s", rep.failed, lastLines(stderr.String(), 20))
	}
	return rep, nil
}

// clientEnv is this process's environment without PG* variables, so that a developer's
// PGOPTIONS or PGSSLMODE cannot change what pgbench measures.
func clientEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

var (
	pgbenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	pgbenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	// PostgreSQL 14+ prints "without initial connection time"; 13 and older print "excluding
	// connections establishing".
	pgbenchLatency = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	pgbenchConnect = regexp.MustCompile(`(?m)^initial connection time = ([0-9.]+) ms`)
	pgbenchTPS     = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)`)
)

// parsePgbench reads pgbench's summary.
func parsePgbench(out string) (pgbenchReport, error) {
	var rep pgbenchReport
	m := pgbenchProcessed.FindStringSubmatch(out)
	if m == nil {
		return rep, errors.New(`pgbench printed no "number of transactions actually processed" line`)
	}
	rep.processed, _ = strconv.ParseInt(m[1], 10, 64) // \d+ that fits: pgbench printed an int64
	if m := pgbenchFailed.FindStringSubmatch(out); m != nil {
		rep.failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := pgbenchLatency.FindStringSubmatch(out); m != nil {
		ms, _ := strconv.ParseFloat(m[1], 64) // [0-9.]+ parses unless malformed, and then 0 is "unknown"
		rep.latency = time.Duration(ms * float64(time.Millisecond))
	}
	if m := pgbenchConnect.FindStringSubmatch(out); m != nil {
		ms, _ := strconv.ParseFloat(m[1], 64) // as the latency
		rep.connect = time.Duration(ms * float64(time.Millisecond))
	}
	m = pgbenchTPS.FindStringSubmatch(out)
	if m == nil && rep.processed == 0 && rep.failed == 0 {
		// Nothing completed within the run (at c=256 on two cores every client may still be
		// connecting when it ends): pgbench then prints no tps, and the rate was 0.
		return rep, nil
	}
	if m == nil {
		return rep, errors.New(`pgbench printed no "tps = N (without initial connection time)" line`)
	}
	tps, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return rep, fmt.Errorf("pgbench tps %q: %w", m[1], err)
	}
	rep.tps = tps
	return rep, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestParsePgbench(t *testing.T) {
	const pg15 = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /work/main/test/bench/testdata/transfer_new.sql
scaling factor: 1
query mode: prepared
number of clients: 8
number of threads: 8
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 12345
number of failed transactions: 2 (0.016%)
latency average = 6.480 ms
initial connection time = 14.020 ms
tps = 1234.567890 (without initial connection time)
`
	const pg13 = `transaction type: x.sql
number of transactions actually processed: 77
latency average = 6.480 ms
tps = 7.100000 (including connections establishing)
tps = 7.700000 (excluding connections establishing)
`
	tests := []struct {
		name    string
		out     string
		want    pgbenchReport
		wantErr string
	}{
		{"pg15", pg15, pgbenchReport{processed: 12345, failed: 2, tps: 1234.56789, latency: 6480 * time.Microsecond, connect: 14020 * time.Microsecond}, ""},
		{"pg13", pg13, pgbenchReport{processed: 77, tps: 7.7, latency: 6480 * time.Microsecond}, ""},
		{"no count", "tps = 1.0 (without initial connection time)\n", pgbenchReport{}, "actually processed"},
		{"no tps", "number of transactions actually processed: 3\n", pgbenchReport{processed: 3}, "tps = N"},
		{"nothing done", "number of transactions actually processed: 0\nnumber of failed transactions: 0 (NaN%)\n", pgbenchReport{}, ""},
		{"nothing done but failures", "number of transactions actually processed: 0\nnumber of failed transactions: 4 (100.000%)\n", pgbenchReport{failed: 4}, "tps = N"},
		{"tps with connections only", "number of transactions actually processed: 3\ntps = 1.0 (including connections establishing)\n", pgbenchReport{processed: 3}, "tps = N"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePgbench(tt.out)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("parsePgbench: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("parsePgbench error = %v, want one mentioning %q", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parsePgbench = %+v, want %+v", got, tt.want)
			}
		})
	}
}
