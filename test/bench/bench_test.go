// Package bench measures what the router costs on top of its shard: in one run on one machine
// it alternates pgbench, executing the statement the router sends (testdata/*.sql), with the
// router serving POST /transfers over real HTTP/TCP to an in-process load generator, at the same
// concurrency against the same durable PostgreSQL, and reports transfers per second of both and
// their ratio, for new keys and for replays.
//
//	go test ./test/bench -run '^$' -bench . -benchtime 1x [-args -bench.duration 10s -bench.clients 8]
//
// Phases run in the order pgbench new keys, router new keys, pgbench replays, router replays, so
// both sides see the same machine. Absolute numbers depend on the machine and on whatever else
// runs on it; the ratios are the result. Nothing here asserts a throughput: a timed assertion
// would flake. Each phase is checked for correctness instead: every new-key request applied
// exactly one transfer and every replay applied none.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/localpg"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
)

var (
	flagDuration = flag.Duration("bench.duration", 10*time.Second,
		"length of each of the four measured phases, whole seconds (default from $"+envDuration+")")
	flagClients = flag.Int("bench.clients", 8,
		"concurrency: pgbench clients and threads, and load generator workers (default from $"+envClients+")")
)

const (
	envDuration = "SHARDGATE_BENCH_DURATION"
	envClients  = "SHARDGATE_BENCH_CLIENTS"
	// maxClients keeps a client id within the 1024 that transfer_new.sql's keys encode.
	maxClients = 500
	// warmup is how long the router runs before the measured phases, so that its shard
	// connections are open and its statement prepared, as pgbench's are when it starts timing.
	warmup = time.Second
	// scope and client are what the router uses in auth mode none.
	client = config.AnonymousClient
	scope  = client + ":transfer"
)

// settings are the benchmark's parameters after flags and environment.
type settings struct {
	duration time.Duration
	clients  int
}

// loadSettings takes each parameter from its flag if given, else from the environment, else
// the flag's default.
func loadSettings() (settings, error) {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	s := settings{duration: *flagDuration, clients: *flagClients}
	if v := os.Getenv(envDuration); v != "" && !given["bench.duration"] {
		d, err := time.ParseDuration(v)
		if err != nil {
			return s, fmt.Errorf("$%s=%q: %w (use e.g. 5s)", envDuration, v, err)
		}
		s.duration = d
	}
	if v := os.Getenv(envClients); v != "" && !given["bench.clients"] {
		n, err := strconv.Atoi(v)
		if err != nil {
			return s, fmt.Errorf("$%s=%q is not a whole number", envClients, v)
		}
		s.clients = n
	}
	if s.duration < time.Second || s.duration%time.Second != 0 {
		return s, fmt.Errorf("phase duration %v must be a whole number of seconds, at least 1s: pgbench -T takes seconds", s.duration)
	}
	if s.clients < 1 || s.clients > maxClients {
		return s, fmt.Errorf("clients %d must be between 1 and %d", s.clients, maxClients)
	}
	return s, nil
}

// measurement is one phase's result.
type measurement struct {
	txns      int64
	tps       float64
	clientCPU time.Duration // the pgbench process, or this process (router and load generator)
	pgCPU     time.Duration // every PostgreSQL process
}

func (m measurement) cpuPerTxn(d time.Duration) string {
	if m.txns == 0 || d < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(m.txns))
}

// BenchmarkRouterVsPgbench runs the four phases once, whatever b.N is: each phase is timed by
// its duration, not by a number of iterations.
func BenchmarkRouterVsPgbench(b *testing.B) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.duration+5*time.Minute)
	defer cancel()

	f := setup(ctx, b, s)
	pb := pgbench{
		bin: pgbenchBin, host: "127.0.0.1", port: f.pg.Port(), user: pgUser, db: pgDatabase,
		clients: s.clients, seconds: int(s.duration / time.Second),
	}
	if pb.vars, err = f.pgbenchVars(ctx); err != nil {
		b.Fatal(err)
	}

	// New keys.
	pgNew := f.phase(ctx, b, "pgbench new keys", func() (measurement, error) {
		pb.scriptPath = testdataPath(b, "transfer_new.sql")
		pb.vars["n"] = "0"
		return f.runPgbench(ctx, pb)
	}, true)
	var created []transfer
	routerNew := f.phase(ctx, b, "router new keys", func() (measurement, error) {
		m, c, err := f.runRouter(ctx, s, nil)
		created = c
		return m, err
	}, true)

	// Replays of the keys each side just created.
	perClient, err := f.pgbenchKeys(ctx, s.clients, pgNew.txns, pb.vars["request_hash"])
	if err != nil {
		b.Fatal(err)
	}
	pgReplay := f.phase(ctx, b, "pgbench replays", func() (measurement, error) {
		pb.scriptPath = testdataPath(b, "transfer_replay.sql")
		pb.vars["clients"] = strconv.Itoa(s.clients)
		pb.vars["per_client"] = strconv.FormatInt(perClient, 10)
		return f.runPgbench(ctx, pb)
	}, false)
	routerReplay := f.phase(ctx, b, "router replays", func() (measurement, error) {
		m, _, err := f.runRouter(ctx, s, created)
		return m, err
	}, false)

	b.ReportMetric(pgNew.tps, "pgbench_new_tps")
	b.ReportMetric(routerNew.tps, "router_new_tps")
	b.ReportMetric(routerNew.tps/pgNew.tps, "new_ratio")
	b.ReportMetric(pgReplay.tps, "pgbench_replay_tps")
	b.ReportMetric(routerReplay.tps, "router_replay_tps")
	b.ReportMetric(routerReplay.tps/pgReplay.tps, "replay_ratio")

	var out strings.Builder
	fmt.Fprintf(&out, "%d clients, %v per phase, durable PostgreSQL (%s), GOMAXPROCS %d on %d cores; CPU µs per transfer measured per process\n",
		s.clients, s.duration, f.durability, runtime.GOMAXPROCS(0), runtime.NumCPU())
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tpgbench tps\trouter tps\trouter/pgbench\tpgbench CPU\trouter+loadgen CPU\tpostgres CPU (pgbench)\tpostgres CPU (router)\t")
	for _, row := range []struct {
		name       string
		pg, router measurement
	}{{"new keys", pgNew, routerNew}, {"replays", pgReplay, routerReplay}} {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.1f%%\t%s\t%s\t%s\t%s\t\n", row.name, row.pg.tps, row.router.tps, 100*row.router.tps/row.pg.tps,
			row.pg.cpuPerTxn(row.pg.clientCPU), row.router.cpuPerTxn(row.router.clientCPU),
			row.pg.cpuPerTxn(row.pg.pgCPU), row.router.cpuPerTxn(row.router.pgCPU))
	}
	tw.Flush()
	b.Log("\n" + out.String())
}

// fixture is one durable shard and a router in front of it.
type fixture struct {
	pg         *localpg.Server
	admin      *pgxpool.Pool // for setup and checks, not used by either side under test
	load       *loadgen
	durability string
}

const (
	pgUser     = "shardgate"
	pgDatabase = "ledger"
)

// setup starts a durable shard, migrates it, gives it the whole keyspace, serves the router in
// front of it on a loopback TCP port and warms the router up.
func setup(ctx context.Context, b *testing.B, s settings) *fixture {
	dir := b.TempDir()
	pg, err := localpg.Start(ctx, localpg.Options{
		Dir:      filepath.Join(dir, "pg"),
		User:     pgUser,
		Database: pgDatabase,
		Durable:  true, // fsync on: a commit costs what it costs in production
		// pgbench's and the router's connections, the admin pool, and some to spare.
		Settings: map[string]string{"max_connections": strconv.Itoa(2*s.clients + 20)},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := pg.Close(); err != nil {
			b.Error(err)
		}
	})
	f := &fixture{pg: pg}
	if f.admin, err = pgxpool.New(ctx, pg.DSN()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.admin.Close)
	var fsync, syncCommit string
	if err := f.admin.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
		b.Fatal(err)
	}
	f.durability = "fsync=" + fsync + " synchronous_commit=" + syncCommit
	if fsync != "on" || syncCommit != "on" {
		b.Fatalf("the shard runs with %s; the benchmark needs PostgreSQL's durable defaults", f.durability)
	}

	if _, err := idem.Migrate(ctx, f.admin); err != nil {
		b.Fatal(err)
	}
	if _, err := idem.EnsurePartitions(ctx, f.admin, idem.Daily, time.Now(), 2); err != nil {
		b.Fatal(err)
	}
	mapPath := filepath.Join(dir, "shardmap.yaml")
	mapYAML := fmt.Sprintf("version: 1\nshards:\n  - name: shard-0\n    dsn: %s\n    ranges: [\"-\"]\n", pg.DSN())
	cfgPath := filepath.Join(dir, "router.yaml")
	// Auth mode none: token checking is a constant cost that pgbench has no counterpart for.
	// The router gets as many shard connections as pgbench has.
	cfgYAML := fmt.Sprintf("listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth:\n  mode: none\nshard_pool:\n  max_conns: %d\n  request_timeout: 30s\n", s.clients)
	if err := os.WriteFile(mapPath, []byte(mapYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	m, err := shardmap.Load(cfg.ShardmapPath)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := idem.ApplyMap(ctx, m, func(string) *pgxpool.Pool { return f.admin }, idem.Daily); err != nil {
		b.Fatal(err)
	}
	topo, err := router.OpenTopology(m, nil, cfg.ShardPool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(topo.Close)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv := router.New(cfg, topo, log, prometheus.NewRegistry())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			b.Error(err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			b.Error(err)
		}
	})
	f.load = newLoadgen("http://"+ln.Addr().String(), s.clients)
	b.Cleanup(f.load.client.CloseIdleConnections)

	if res := f.load.run(ctx, s.clients, warmup, nil); res.err != nil {
		b.Fatalf("warming the router up: %v", res.err)
	}
	return f
}

// pgbenchVars returns the values transfer_new.sql and transfer_replay.sql take from -D: the
// router's scope, client and currency, one request hash of the router's form, and a response
// the router stored during the warm-up, so that pgbench stores responses of the same size.
func (f *fixture) pgbenchVars(ctx context.Context) (map[string]string, error) {
	var response string
	if err := f.admin.QueryRow(ctx, "SELECT response::text FROM idempotency_record WHERE scope = $1 LIMIT 1", scope).Scan(&response); err != nil {
		return nil, fmt.Errorf("reading a response the router stored during the warm-up: %w", err)
	}
	return map[string]string{
		"scope":        scope,
		"client":       client,
		"currency":     "EUR",
		"request_hash": router.Fingerprint(http.MethodPost, "/transfers", router.TransferInput{Src: 1, Dst: 2, Amount: 1, Currency: "EUR"}),
		"response":     response,
	}, nil
}

// phase runs one measured phase and checks what it wrote to the shard: a new-key phase must
// have applied exactly one transfer (one ledger row, one idempotency record) per transaction it
// counted, a replay phase none.
func (f *fixture) phase(ctx context.Context, b *testing.B, name string, run func() (measurement, error), newKeys bool) measurement {
	ledger0, records0, err := f.counts(ctx)
	if err != nil {
		b.Fatal(err)
	}
	pgCPU0, pgErr := postgresCPU(f.pg.PID())
	m, err := run()
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	pgCPU1, pgErr1 := postgresCPU(f.pg.PID())
	m.pgCPU = pgCPU1 - pgCPU0
	if pgErr != nil || pgErr1 != nil {
		m.pgCPU = -1 // shown as n/a
	}
	ledger1, records1, err := f.counts(ctx)
	if err != nil {
		b.Fatal(err)
	}
	want := int64(0)
	if newKeys {
		want = m.txns
	}
	if ledger1-ledger0 != want || records1-records0 != want {
		b.Fatalf("%s: %d transactions wrote %d ledger rows and %d idempotency records; want %d of each",
			name, m.txns, ledger1-ledger0, records1-records0, want)
	}
	if m.txns == 0 {
		b.Fatalf("%s: no transfer completed", name)
	}
	return m
}

func (f *fixture) counts(ctx context.Context) (ledger, records int64, err error) {
	err = f.admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM idempotency_record)").Scan(&ledger, &records)
	return ledger, records, err
}

func (f *fixture) runPgbench(ctx context.Context, pb pgbench) (measurement, error) {
	rep, cpu, err := pb.run(ctx)
	return measurement{txns: rep.processed, tps: rep.tps, clientCPU: cpu}, err
}

// runRouter runs the load generator for one phase: new keys with replay nil, else replays of
// replay. It returns the transfers created.
func (f *fixture) runRouter(ctx context.Context, s settings, replay []transfer) (measurement, []transfer, error) {
	cpu0 := processCPU()
	res := f.load.run(ctx, s.clients, s.duration, replay)
	m := measurement{txns: res.ok, tps: res.tps(), clientCPU: processCPU() - cpu0}
	return m, res.created, res.err
}

// pgbenchKeys checks the keys transfer_new.sql created (client id in the key's last 10 bits)
// and returns per_client for transfer_replay.sql: how many keys the client that created the
// fewest has, so that client c's keys 1..per_client all exist. It also replays one of them
// with the router's statement, to check that the replay script will be answered "replayed".
func (f *fixture) pgbenchKeys(ctx context.Context, clients int, txns int64, requestHash string) (int64, error) {
	var total, fewest, seen int64
	var sample string
	err := f.admin.QueryRow(ctx, `
		WITH k AS (SELECT key FROM idempotency_record WHERE scope = $1 AND key ~ '^[0-9]{26}$'),
		     per AS (SELECT key::bigint % 1024 AS c, count(*) AS n FROM k GROUP BY 1)
		SELECT (SELECT coalesce(sum(n), 0) FROM per), (SELECT coalesce(min(n), 0) FROM per),
		       (SELECT count(*) FROM per), (SELECT coalesce(min(key), '') FROM k)`, scope).Scan(&total, &fewest, &seen, &sample)
	if err != nil {
		return 0, fmt.Errorf("counting pgbench's keys: %w", err)
	}
	if total != txns || seen != int64(clients) || fewest < 1 {
		return 0, fmt.Errorf("pgbench reported %d transactions from %d clients; the shard holds %d of its keys from %d clients",
			txns, clients, total, seen)
	}
	var outcome string
	err = f.admin.QueryRow(ctx, `SELECT outcome FROM shardgate_transfer($1, $2, $3, 0, '', $4, 1, 2, 1, 'EUR', NULL, '{}')`,
		scope, sample, requestHash, client).Scan(&outcome)
	if err != nil {
		return 0, fmt.Errorf("replaying pgbench's key %s: %w", sample, err)
	}
	if outcome != string(idem.Replayed) {
		return 0, fmt.Errorf("replaying pgbench's key %s gave %q, want %q", sample, outcome, idem.Replayed)
	}
	return fewest, nil
}

func testdataPath(b *testing.B, name string) string {
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// processCPU returns the CPU time this process has used: the router and the load generator.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on every Linux platform Go
// supports).
const clockTick = 10 * time.Millisecond

// postgresCPU returns the CPU time used so far by the postmaster pid and its processes: the
// live ones, and those that exited (the kernel adds them to the postmaster's children's times
// once it reaps them).
func postgresCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, errors.New("postgres is not running")
	}
	_, own, children, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	total := own + children
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, cpu, _, err := procStat(child)
		if err == nil && ppid == pid {
			total += cpu
		}
	}
	return total, nil
}

// procStat reads a process's parent, its own CPU time and that of its reaped children.
func procStat(pid int) (ppid int, own, children time.Duration, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces; fields count from 3 after it.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 15 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	n := func(field int) int64 { v, _ := strconv.ParseInt(fields[field-3], 10, 64); return v }
	ppid = int(n(4))
	own = time.Duration(n(14)+n(15)) * clockTick
	children = time.Duration(n(16)+n(17)) * clockTick
	return ppid, own, children, nil
}
