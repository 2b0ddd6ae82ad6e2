// Package bench measures what the router costs on top of its shard. In one run on one machine
// it alternates pgbench, executing the statement the router sends (testdata/*.sql), with the
// router serving POST /transfers over real HTTP/TCP to an in-process load generator, at the same
// concurrency against the same durable PostgreSQL, and reports transfers per second of both and
// their ratio, for new keys and for replays:
//
//	go test ./test/bench -run '^$' -bench . -benchtime 1x
//	go test ./test/bench -run '^$' -bench . -benchtime 1x -args -bench.duration 3s -bench.clients 16 -bench.rounds 3
//
// A round is four phases: pgbench on new keys, the router on new keys, pgbench replaying keys it
// created, the router replaying keys it created; odd rounds run the router before pgbench. The
// defaults (2 rounds of 5 s phases, 8 clients) give each side 10 s per workload and take under a
// minute. Absolute numbers depend on the machine and on whatever else runs on it; the ratios are
// the result. Nothing here asserts a throughput, since a timed assertion would flake. Each phase
// is checked for correctness instead: every new-key request applied exactly one transfer and
// every replay applied none.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/router"
)

var (
	flagDuration = flag.Duration("bench.duration", 5*time.Second,
		"length of each phase, whole seconds (default from $"+envDuration+")")
	flagClients = flag.Int("bench.clients", 8,
		"concurrency: pgbench clients and threads, and load generator workers (default from $"+envClients+")")
	flagRounds = flag.Int("bench.rounds", 2,
		"how many times the four phases run; odd rounds run the router before pgbench (default from $"+envRounds+")")
)

const (
	envDuration = "SHARDGATE_BENCH_DURATION"
	envClients  = "SHARDGATE_BENCH_CLIENTS"
	envRounds   = "SHARDGATE_BENCH_ROUNDS"
	// maxClients keeps a client id within the 1024 that transfer_new.sql's keys encode.
	maxClients = 500
	// maxRounds keeps the counters of transfer_new.sql, roundStride apart, within permute's 2^40.
	maxRounds   = 100
	roundStride = 1 << 24
	// warmup is how long the router runs before the measured phases, so that its shard
	// connections are open and its statement prepared, as pgbench's are when it starts timing.
	warmup = time.Second
	// scope and client are what the router uses in auth mode none.
	client = config.AnonymousClient
	scope  = client + ":transfer"
)

// settings are the benchmark's parameters after flags and environment.
type settings struct {
	duration time.Duration // of one phase
	clients  int
	rounds   int
}

// loadSettings takes each parameter from its flag if given, else from the environment, else
// the flag's default.
func loadSettings() (settings, error) {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	s := settings{duration: *flagDuration, clients: *flagClients, rounds: *flagRounds}
	if v := os.Getenv(envDuration); v != "" && !given["bench.duration"] {
		d, err := time.ParseDuration(v)
		if err != nil {
			return s, fmt.Errorf("$%s=%q: %w (use e.g. 5s)", envDuration, v, err)
		}
		s.duration = d
	}
	for _, e := range []struct {
		env, flag string
		dst       *int
	}{{envClients, "bench.clients", &s.clients}, {envRounds, "bench.rounds", &s.rounds}} {
		if v := os.Getenv(e.env); v != "" && !given[e.flag] {
			n, err := strconv.Atoi(v)
			if err != nil {
				return s, fmt.Errorf("$%s=%q is not a whole number", e.env, v)
			}
			*e.dst = n
		}
	}
	if s.duration < time.Second || s.duration%time.Second != 0 {
		return s, fmt.Errorf("phase duration %v must be a whole number of seconds, at least 1s: pgbench -T takes seconds", s.duration)
	}
	if s.clients < 1 || s.clients > maxClients {
		return s, fmt.Errorf("clients %d must be between 1 and %d", s.clients, maxClients)
	}
	if s.rounds < 1 || s.rounds > maxRounds {
		return s, fmt.Errorf("rounds %d must be between 1 and %d", s.rounds, maxRounds)
	}
	return s, nil
}

// workload is what the requests do: apply new transfers, or replay applied ones.
type workload int

const (
	newKeys workload = iota
	replays
)

func (w workload) String() string { return [...]string{"new keys", "replays"}[w] }

// side is who sends the statements: pgbench directly, or the router for the load generator.
type side int

const (
	pgbenchSide side = iota
	routerSide
)

func (s side) String() string { return [...]string{"pgbench", "router"}[s] }

// measurement is what one side did in one or more phases of one workload.
type measurement struct {
	txns      int64
	elapsed   time.Duration // pgbench's excludes connecting, as its tps does
	clientCPU time.Duration // the pgbench process, or this process (router and load generator)
	pgCPU     time.Duration // every PostgreSQL process; negative if unknown
	latency   time.Duration // summed over the transactions, as their sender saw it
	// shardTime and shardCalls are the router's own measure of its shard calls, from its
	// shardgate_shard_request_duration_seconds histogram; shardCalls is 0 for pgbench.
	shardTime  time.Duration
	shardCalls uint64
	phaseTPS   []float64 // of each phase added
}

func (m measurement) tps() float64 { return float64(m.txns) / m.elapsed.Seconds() }

func (m *measurement) add(o measurement) {
	m.phaseTPS = append(m.phaseTPS, o.tps())
	m.txns += o.txns
	m.elapsed += o.elapsed
	m.clientCPU += o.clientCPU
	m.latency += o.latency
	m.shardTime += o.shardTime
	m.shardCalls += o.shardCalls
	if m.pgCPU < 0 || o.pgCPU < 0 {
		m.pgCPU = -1
	} else {
		m.pgCPU += o.pgCPU
	}
}

// perTxn formats CPU time per transaction in microseconds.
func (m measurement) perTxn(cpu time.Duration) string {
	if m.txns == 0 || cpu < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", float64(cpu.Microseconds())/float64(m.txns))
}

// meanLatency formats the mean of total over n in milliseconds.
func meanLatency(total time.Duration, n uint64) string {
	if n == 0 || total <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", float64(total)/float64(n)/float64(time.Millisecond))
}

// BenchmarkRouterVsPgbench runs its phases once, whatever b.N is: each phase is timed by its
// duration, not by a number of iterations. Every round runs pgbench and the router on new keys,
// then on replays; odd rounds run the router first, so that neither side always meets the
// machine (and the tables) in the state the other left.
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(4*s.rounds)*s.duration+5*time.Minute)
	defer cancel()

	f := setup(ctx, b, s)
	pb := pgbench{
		bin: pgbenchBin, host: "127.0.0.1", port: f.pg.Port(), user: pgUser, db: pgDatabase,
		clients: s.clients, seconds: int(s.duration / time.Second),
	}
	if pb.vars, err = f.pgbenchVars(ctx); err != nil {
		b.Fatal(err)
	}
	newScript, replayScript := testdataPath(b, "transfer_new.sql"), testdataPath(b, "transfer_replay.sql")
	pbKeys := newPgbenchKeys(s.clients)
	var created []transfer // by the router, for its replays

	run := func(w workload, sd side, round int) (measurement, error) {
		switch {
		case w == newKeys && sd == pgbenchSide:
			pb.scriptPath = newScript
			pb.vars["n"] = strconv.Itoa(round * roundStride)
			m, err := f.runPgbench(ctx, pb)
			if err == nil {
				err = pbKeys.update(ctx, f, m.txns, pb.vars["request_hash"])
			}
			return m, err
		case w == newKeys && sd == routerSide:
			m, c, err := f.runRouter(ctx, s.clients, s.duration, nil)
			created = append(created, c...)
			return m, err
		case sd == pgbenchSide:
			pb.scriptPath = replayScript
			pb.vars["clients"] = strconv.Itoa(s.clients)
			pb.vars["rounds"] = strconv.Itoa(round + 1)
			pb.vars["per_client"] = strconv.FormatInt(pbKeys.fewest, 10)
			return f.runPgbench(ctx, pb)
		default:
			m, _, err := f.runRouter(ctx, s.clients, s.duration, created)
			return m, err
		}
	}
	var total [2][2]measurement // [workload][side]
	for round := range s.rounds {
		order := []side{pgbenchSide, routerSide}
		if round%2 == 1 {
			order = []side{routerSide, pgbenchSide}
		}
		for _, w := range []workload{newKeys, replays} {
			for _, sd := range order {
				name := fmt.Sprintf("round %d: %s %s", round+1, sd, w)
				total[w][sd].add(f.phase(ctx, b, name, w, func() (measurement, error) { return run(w, sd, round) }))
			}
		}
	}

	pgNew, routerNew := total[newKeys][pgbenchSide], total[newKeys][routerSide]
	pgReplay, routerReplay := total[replays][pgbenchSide], total[replays][routerSide]
	b.ReportMetric(pgNew.tps(), "pgbench_new_tps")
	b.ReportMetric(routerNew.tps(), "router_new_tps")
	b.ReportMetric(routerNew.tps()/pgNew.tps(), "new_ratio")
	b.ReportMetric(pgReplay.tps(), "pgbench_replay_tps")
	b.ReportMetric(routerReplay.tps(), "router_replay_tps")
	b.ReportMetric(routerReplay.tps()/pgReplay.tps(), "replay_ratio")

	// At most 9 lines: the testing package cuts a benchmark's log after that.
	var out strings.Builder
	fmt.Fprintf(&out, "%d clients, %d round(s) of %v phases, durable PostgreSQL (%s), GOMAXPROCS %d on %d cores\n",
		s.clients, s.rounds, s.duration, f.durability, runtime.GOMAXPROCS(0), runtime.NumCPU())
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tpgbench tps\trouter tps\trouter/pgbench\ttps of each phase: pgbench; router")
	for _, w := range []workload{newKeys, replays} {
		pg, rt := total[w][pgbenchSide], total[w][routerSide]
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.1f%%\t%s; %s\n", w, pg.tps(), rt.tps(), 100*rt.tps()/pg.tps(),
			formatTPS(pg.phaseTPS), formatTPS(rt.phaseTPS))
	}
	tw.Flush()
	tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tmean latency ms: pgbench\trouter\trouter's shard call\tCPU µs/transfer: pgbench\trouter+loadgen\tpostgres w/ pgbench\tpostgres w/ router")
	for _, w := range []workload{newKeys, replays} {
		pg, rt := total[w][pgbenchSide], total[w][routerSide]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", w,
			meanLatency(pg.latency, uint64(pg.txns)), meanLatency(rt.latency, uint64(rt.txns)), meanLatency(rt.shardTime, rt.shardCalls),
			pg.perTxn(pg.clientCPU), rt.perTxn(rt.clientCPU), pg.perTxn(pg.pgCPU), rt.perTxn(rt.pgCPU))
	}
	tw.Flush()
	b.Log(strings.TrimSuffix(out.String(), "\n"))
}

func formatTPS(tps []float64) string {
	s := make([]string, len(tps))
	for i, v := range tps {
		s[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(s, " ")
}

// fixture is one durable shard and a router in front of it.
type fixture struct {
	pg         *localpg.Server
	admin      *pgxpool.Pool // for setup and checks, not used by either side under test
	load       *loadgen
	metrics    *prometheus.Registry // the router's
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
	if _, err := idem.EnsurePartitions(ctx, f.admin, partition.Daily, time.Now(), 2); err != nil {
		b.Fatal(err)
	}
	mapPath := filepath.Join(dir, "shardmap.yaml")
	mapYAML := fmt.Sprintf("version: 1\nshards:\n  - name: shard-0\n    dsn: %s\n    ranges: [\"-\"]\n", pg.DSN())
	cfgPath := filepath.Join(dir, "router.yaml")
	// Auth mode none: token checking is a constant cost that pgbench has no counterpart for.
	// The router gets as many shard connections as pgbench has.
	cfgYAML := fmt.Sprintf("listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth:\n  mode: none\nshard_pool:\n  max_conns: %d\n", s.clients)
	if err := os.WriteFile(mapPath, []byte(mapYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, m, err := service.Load(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := rangemove.ApplyMap(ctx, m, func(string) *pgxpool.Pool { return f.admin }, partition.Daily); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	svc, err := service.New(cfg, m, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(svc.Close)
	f.metrics = svc.Registry
	srv := svc.Router

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	// The timeouts `router serve` uses: each costs a deadline per request.
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       cfg.HTTP.ReadTimeout,
		WriteTimeout:      cfg.HTTP.WriteTimeout,
		IdleTimeout:       cfg.HTTP.IdleTimeout,
		MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
	}
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
func (f *fixture) phase(ctx context.Context, b *testing.B, name string, w workload, run func() (measurement, error)) measurement {
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
	if w == newKeys {
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
	if err != nil {
		return measurement{}, err
	}
	if rep.tps <= 0 {
		return measurement{}, fmt.Errorf("pgbench reports %g tps", rep.tps)
	}
	elapsed := time.Duration(float64(rep.processed) / rep.tps * float64(time.Second))
	return measurement{txns: rep.processed, elapsed: elapsed, clientCPU: cpu, latency: rep.latency * time.Duration(rep.processed)}, nil
}

// runRouter runs the load generator for one phase: new keys with replay nil, else replays of
// replay. It returns the transfers created.
func (f *fixture) runRouter(ctx context.Context, clients int, d time.Duration, replay []transfer) (measurement, []transfer, error) {
	cpu0 := processCPU()
	shardTime0, shardCalls0 := f.shardTime()
	res := f.load.run(ctx, clients, d, replay)
	shardTime1, shardCalls1 := f.shardTime()
	m := measurement{
		txns: res.ok, elapsed: res.elapsed, clientCPU: processCPU() - cpu0, latency: res.latency,
		shardTime: shardTime1 - shardTime0, shardCalls: shardCalls1 - shardCalls0,
	}
	return m, res.created, res.err
}

// shardTimeMetric is the router's histogram of its calls to shards.
const shardTimeMetric = "shardgate_shard_request_duration_seconds"

// shardTime returns the total duration and number of the router's shard calls so far, or zeros
// if the router no longer exports shardTimeMetric.
func (f *fixture) shardTime() (time.Duration, uint64) {
	families, err := f.metrics.Gather()
	if err != nil {
		return 0, 0
	}
	var sum float64
	var n uint64
	for _, fam := range families {
		if fam.GetName() != shardTimeMetric {
			continue
		}
		for _, m := range fam.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return time.Duration(sum * float64(time.Second)), n
}

// pgbenchKeys follows the keys transfer_new.sql created, to tell transfer_replay.sql which
// exist: in round r, client c created keys n = r*roundStride+1 … r*roundStride+count, and the
// client id is the key's value modulo 1024.
type pgbenchKeys struct {
	clients int
	total   map[int64]int64 // keys per client, over all rounds so far
	fewest  int64           // the fewest keys any client created in any round
}

func newPgbenchKeys(clients int) *pgbenchKeys {
	return &pgbenchKeys{clients: clients, total: map[int64]int64{}, fewest: math.MaxInt64}
}

// update accounts for a pgbench run that reported txns transactions: each must have created a
// key, and every client must have created at least one. It also replays one key with the
// router's statement, which checks that transfer_replay.sql will be answered "replayed".
func (k *pgbenchKeys) update(ctx context.Context, f *fixture, txns int64, requestHash string) error {
	rows, err := f.admin.Query(ctx, `SELECT key::bigint % 1024, count(*) FROM idempotency_record
		WHERE scope = $1 AND key ~ '^[0-9]{26}$' GROUP BY 1`, scope)
	if err != nil {
		return fmt.Errorf("counting pgbench's keys: %w", err)
	}
	total, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var v [2]int64
		err := r.Scan(&v[0], &v[1])
		return v, err
	})
	if err != nil {
		return fmt.Errorf("counting pgbench's keys: %w", err)
	}
	now := make(map[int64]int64, len(total))
	for _, v := range total {
		now[v[0]] = v[1]
	}
	var created int64
	for c := range int64(k.clients) {
		n := now[c] - k.total[c]
		if n < 1 {
			return fmt.Errorf("pgbench client %d created no key in this run: raise -bench.duration", c)
		}
		created += n
		k.fewest = min(k.fewest, n)
		k.total[c] = now[c]
	}
	if created != txns || len(now) != k.clients {
		return fmt.Errorf("pgbench reported %d transactions from %d clients; the shard holds %d new keys from %d clients",
			txns, k.clients, created, len(now))
	}
	var sample, outcome string
	err = f.admin.QueryRow(ctx, `SELECT key FROM idempotency_record WHERE scope = $1 AND key ~ '^[0-9]{26}$' LIMIT 1`, scope).Scan(&sample)
	if err == nil {
		err = f.admin.QueryRow(ctx, `SELECT outcome FROM shardgate_transfer($1, $2, $3, 0, '', $4, 1, 2, 1, 'EUR', NULL, '{}')`,
			scope, sample, requestHash, client).Scan(&outcome)
	}
	if err != nil {
		return fmt.Errorf("replaying one of pgbench's keys: %w", err)
	}
	if outcome != string(idem.Replayed) {
		return fmt.Errorf("replaying pgbench's key %s gave %q, want %q", sample, outcome, idem.Replayed)
	}
	return nil
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
