package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
)

const (
	pgUser     = "shardgate"
	pgDatabase = "ledger"
	// client and scope are what the router uses in auth mode none.
	client = config.AnonymousClient
	scope  = client + ":transfer"
	// warmup is how long a router runs before its measured phases, so that its shard
	// connections are open and its statement prepared, as pgbench's are when it starts timing.
	warmup = time.Second
	// floorWarmup only opens the load generator's connections to the floor.
	floorWarmup = 250 * time.Millisecond
	// routerMaxConns caps the router's shard pool: at concurrency c it has min(c, 64)
	// connections, and routerMaxWaiting lets the other requests of c=256 queue for one instead
	// of being answered 503 shard-busy.
	routerMaxConns   = 64
	routerMaxWaiting = 1024
	// groupCommitOn is config's default max_batch; groupCommitOff sends every transfer alone.
	groupCommitOn  = 64
	groupCommitOff = 1
)

// fixture is one durable PostgreSQL holding the shard and the anchor's tables, the floor, and
// what the phases carry from one to the next.
type fixture struct {
	pg    *localpg.Server
	admin *pgxpool.Pool // for setup and checks, not used by any side under test
	// pg2 and admin2 are a second PostgreSQL server, the second cross shard's: two shards are
	// two servers, each with its own WAL and its own flushes, as in production.
	pg2    *localpg.Server
	admin2 *pgxpool.Pool
	dir    string
	aged   int // days of record partitions before today on every shard (-bench.aged)
	// statements is how many statements each phase of the same, cross and peer rows prints
	// (-bench.statements); both servers load pg_stat_statements when it is not 0.
	statements int
	shardMap   *shardmap.Map
	base       *config.Config // what every router's config has but its pool and group commit
	floor      *server
	pgbench    pgbench
	cross      *crossShards      // the cross-shard phases' two shards
	vars       map[string]string // transfer_new.sql's -D values but n
	created    []transfer        // by the routers, for their replays
	runs       int               // of transfer_new.sql so far
	// connecting is, per concurrency, how long pgbench's clients may take to connect: half as
	// long again as the slowest seen (pgbenchRun.connecting), a guess before the first run.
	connecting map[int]time.Duration

	pgVersion, durability string
	maxConns              int // PostgreSQL's max_connections
	log                   *slog.Logger
}

// setup starts a durable PostgreSQL, migrates it as a shard owning the whole keyspace, creates
// the anchor's tables, serves the floor, and checks that the floor answers as the router does.
func setup(ctx context.Context, b *testing.B, s settings, pgbenchBin string) *fixture {
	f := &fixture{aged: s.aged, statements: s.statements, dir: b.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), connecting: map[int]time.Duration{}}
	for _, c := range s.concurrency {
		f.connecting[c] = time.Duration(c) * 10 * time.Millisecond // about what each took here, c=256 up to 2.5 s
	}
	if testing.Verbose() {
		f.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	f.pg, f.admin = f.startPostgres(ctx, b, "pg", f.maxConnsFor(slices.Max(s.concurrency)))
	f.pg2, f.admin2 = f.startPostgres(ctx, b, "pg2", min(slices.Max(s.concurrency), routerMaxConns)+30)
	if f.statements > 0 {
		if err := createStatementViews(ctx, f.admin, f.admin2); err != nil {
			b.Fatal(err)
		}
	}
	f.pgbench = pgbench{bin: pgbenchBin, host: "127.0.0.1", port: f.pg.Port(), user: pgUser, db: pgDatabase}
	if err := f.prepareShard(ctx); err != nil {
		b.Fatal(err)
	}
	if err := f.prepareCross(ctx); err != nil {
		b.Fatal(err)
	}
	var err error
	if f.floor, err = serve(floorHandler(f.base.Transfers.DefaultCurrency), f.base.HTTP, slices.Max(s.concurrency)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := f.floor.close(); err != nil {
			b.Error(err)
		}
	})
	if err := f.probe(ctx); err != nil {
		b.Fatal(err)
	}
	if f.vars, err = f.pgbenchVars(ctx); err != nil {
		b.Fatal(err)
	}
	return f
}

// maxConnsFor is the first server's max_connections for concurrencies up to maxC: two pgbench
// runs' connections (one's may still be closing as the next opens its own), two routers' pools
// (group commit on and off), the cross-shard router's and the peer's, the admin pool, and some to
// spare.
func (f *fixture) maxConnsFor(maxC int) int {
	f.maxConns = 2*maxC + 4*min(maxC, routerMaxConns) + 30
	return f.maxConns
}

// serverSettings are a benchmark server's settings beyond localpg's durable defaults.
func (f *fixture) serverSettings(maxConns int) map[string]string {
	settings := map[string]string{"max_connections": strconv.Itoa(maxConns)}
	if f.statements > 0 {
		maps.Copy(settings, statementSettings)
	}
	return settings
}

// startPostgres starts a server in dir with maxConns connections and returns it with an admin
// pool, refusing to go on unless it is durable.
func (f *fixture) startPostgres(ctx context.Context, b *testing.B, dir string, maxConns int) (*localpg.Server, *pgxpool.Pool) {
	pg, err := localpg.Start(ctx, localpg.Options{
		Dir:      filepath.Join(f.dir, dir),
		User:     pgUser,
		Database: pgDatabase,
		Durable:  true, // fsync on: a commit costs what it costs in production
		Settings: f.serverSettings(maxConns),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := pg.Close(); err != nil {
			b.Error(err)
		}
	})
	admin, err := pgxpool.New(ctx, pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admin.Close)
	var fsync, syncCommit string
	err = admin.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('server_version')").
		Scan(&fsync, &syncCommit, &f.pgVersion)
	if err != nil {
		b.Fatal(err)
	}
	f.durability = "fsync=" + fsync + " synchronous_commit=" + syncCommit
	if fsync != "on" || syncCommit != "on" {
		b.Fatalf("PostgreSQL runs with %s; the benchmark needs its durable defaults", f.durability)
	}
	return pg, admin
}

// prepareShard migrates the database, gives it the whole keyspace in a one-shard map, creates
// the anchor's tables, and reads the routers' common configuration.
func (f *fixture) prepareShard(ctx context.Context) error {
	if _, err := idem.Migrate(ctx, f.admin); err != nil {
		return err
	}
	if err := f.partition(ctx, f.admin); err != nil {
		return err
	}
	for _, schema := range []string{"anchor", "peer"} {
		tables, err := os.ReadFile(filepath.Join("testdata", schema+"_schema.sql"))
		if err != nil {
			return err
		}
		if _, err := f.admin.Exec(ctx, string(tables)); err != nil {
			return fmt.Errorf("creating the %s's tables: %w", schema, err)
		}
	}
	mapPath := filepath.Join(f.dir, "shardmap.yaml")
	var err error
	mapYAML := fmt.Sprintf("version: 1\nshards:\n  - name: shard-0\n    dsn: %s\n    ranges: [\"-\"]\n", f.pg.DSN())
	if err := os.WriteFile(mapPath, []byte(mapYAML), 0o600); err != nil {
		return err
	}
	if f.shardMap, err = shardmap.Load(mapPath); err != nil {
		return err
	}
	if _, err := rangemove.ApplyMap(ctx, f.shardMap, func(string) *pgxpool.Pool { return f.admin }, partition.Daily); err != nil {
		return err
	}
	f.base, err = f.routerConfig(1, groupCommitOn)
	return err
}

// routerConfig is the configuration of a router for concurrency c. Auth mode none: token
// checking is a constant cost that pgbench has no counterpart for.
func (f *fixture) routerConfig(c, maxBatch int) (*config.Config, error) {
	yaml := fmt.Sprintf("listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth:\n  mode: none\n"+
		"shard_pool:\n  max_conns: %d\n  max_waiting: %d\ngroup_commit:\n  max_batch: %d\n",
		min(c, routerMaxConns), routerMaxWaiting, maxBatch)
	return config.Parse(filepath.Join(f.dir, "router.yaml"), []byte(yaml))
}

// routerServer is a router built by service.New and served on its own loopback port.
type routerServer struct {
	*server
	svc *service.Service
}

// startRouter builds and serves a router of the bench shard for concurrency c with group
// commit's max_batch.
func (f *fixture) startRouter(c, maxBatch int) (*routerServer, error) {
	return f.startRouterOn(f.shardMap, c, maxBatch)
}

// startRouterOn builds and serves a router of the shards of m for concurrency c with group
// commit's max_batch. Its relay does not run unless the caller runs it.
func (f *fixture) startRouterOn(m *shardmap.Map, c, maxBatch int) (*routerServer, error) {
	cfg, err := f.routerConfig(c, maxBatch)
	if err != nil {
		return nil, err
	}
	svc, err := service.New(cfg, m, f.log)
	if err != nil {
		return nil, err
	}
	srv, err := serve(svc.Router, cfg.HTTP, c)
	if err != nil {
		svc.Close()
		return nil, err
	}
	return &routerServer{server: srv, svc: svc}, nil
}

// groupStats are a router's group commit counters, summed over its shards: groups sent, the
// transfers in them, the groups that stalled, the seconds transfers waited to join a group, and
// the seconds they spent on their shard (that wait, then their group's statement and commit).
type groupStats struct {
	groups, items, stalls, waited, onShard float64
}

func (g groupStats) plus(o groupStats) groupStats {
	return groupStats{g.groups + o.groups, g.items + o.items, g.stalls + o.stalls, g.waited + o.waited, g.onShard + o.onShard}
}

func (g groupStats) minus(o groupStats) groupStats {
	return g.plus(groupStats{-o.groups, -o.items, -o.stalls, -o.waited, -o.onShard})
}

// readGroupStats reads the router's group commit metrics (shardgate_group_commit_size,
// _wait_seconds, _stalls_total, and shardgate_shard_request_duration_seconds) as its /metrics
// would show them.
func (r *routerServer) readGroupStats() (groupStats, error) {
	mfs, err := r.svc.Registry.Gather()
	if err != nil {
		return groupStats{}, fmt.Errorf("reading the router's metrics: %w", err)
	}
	var g groupStats
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "shardgate_group_commit_size":
				g.groups += float64(m.GetHistogram().GetSampleCount())
				g.items += m.GetHistogram().GetSampleSum()
			case "shardgate_group_commit_stalls_total":
				g.stalls += m.GetCounter().GetValue()
			case "shardgate_group_commit_wait_seconds":
				g.waited += m.GetHistogram().GetSampleSum()
			case "shardgate_shard_request_duration_seconds":
				g.onShard += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return g, nil
}

func (r *routerServer) close() error {
	err := r.server.close()
	r.svc.Close()
	return err
}

// server is an HTTP server under test on its own loopback port, and the load generator's
// client for it.
type server struct {
	hs     *http.Server
	served chan error
	load   *loadgen
}

// serve serves h with the timeouts `router serve` uses (each costs a deadline per request) for
// at most workers concurrent clients.
func serve(h http.Handler, hc config.HTTP, workers int) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{
		hs: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: hc.ReadHeaderTimeout,
			ReadTimeout:       hc.ReadTimeout,
			WriteTimeout:      hc.WriteTimeout,
			IdleTimeout:       hc.IdleTimeout,
			MaxHeaderBytes:    hc.MaxHeaderBytes,
		},
		served: make(chan error, 1),
		load:   newLoadgen("http://"+ln.Addr().String(), workers),
	}
	go func() { s.served <- s.hs.Serve(ln) }()
	return s, nil
}

func (s *server) close() error {
	s.load.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.hs.Shutdown(ctx)
	if serr := <-s.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// probe sends one new transfer to a router and to the floor and checks that both answer with
// the same status, headers and body, so that the floor stays a floor for the router's answer.
func (f *fixture) probe(ctx context.Context) error {
	rt, err := f.startRouter(1, groupCommitOn)
	if err != nil {
		return err
	}
	defer rt.close() //nolint:errcheck // a failed shutdown of the probe changes no measurement
	t := newTransfer(1, 100)
	want, err := rt.load.exchange(ctx, t)
	if err != nil {
		return fmt.Errorf("probing the router: %w", err)
	}
	f.created = append(f.created, t)
	got, err := f.floor.load.exchange(ctx, t)
	if err != nil {
		return fmt.Errorf("probing the floor: %w", err)
	}
	if got.String() != want.String() {
		return fmt.Errorf("the floor answers a transfer with\n%s\nbut the router with\n%s\nmake the floor write what the router writes", got, want)
	}
	return nil
}

// pgbenchVars returns the values transfer_new.sql takes from -D but n: the router's scope,
// client and currency, one request hash of the router's form, the configured retention, and a
// response the router stored, so that pgbench stores responses of the same size.
func (f *fixture) pgbenchVars(ctx context.Context) (map[string]string, error) {
	var response string
	if err := f.admin.QueryRow(ctx, "SELECT response::text FROM idempotency_record WHERE scope = $1 LIMIT 1", scope).Scan(&response); err != nil {
		return nil, fmt.Errorf("reading a response the router stored: %w", err)
	}
	in := router.TransferInput{Src: 1, Dst: 2, Amount: 1, Currency: f.base.Transfers.DefaultCurrency}
	return map[string]string{
		"scope":        scope,
		"client":       client,
		"currency":     in.Currency,
		"request_hash": router.Fingerprint(http.MethodPost, "/transfers", in),
		"response":     response,
		"retention":    strconv.FormatInt(int64(f.base.Idempotency.Retention/time.Second), 10) + " seconds",
	}, nil
}

// partition gives a shard's idempotency_record today's partition and two ahead, and one for each
// of the f.aged days before today, as upkeep leaves a shard that has run that long (every record
// under the rule that dates it no earlier than its key: see shardgate_record_floor). A lookup
// bounded by a key's time reads one or two of them; an unbounded one reads them all.
func (f *fixture) partition(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := idem.EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 2); err != nil {
		return err
	}
	if f.aged == 0 {
		return nil
	}
	_, err := pool.Exec(ctx, `DO $$
DECLARE
    d date;
    name text;
BEGIN
    FOR i IN 1 .. `+strconv.Itoa(f.aged)+` LOOP
        d := (now() AT TIME ZONE 'UTC')::date - i;
        name := 'idempotency_record_' || to_char(d, 'YYYY_MM_DD');
        EXECUTE format('CREATE TABLE %I (LIKE idempotency_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I UNIQUE (scope, key)', name, name || '_scope_key');
        EXECUTE format('ALTER TABLE idempotency_record ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       name, d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
    UPDATE shardgate_record_floor SET unchecked_before = now() - make_interval(days => `+strconv.Itoa(f.aged+1)+`);
END
$$`)
	if err != nil {
		return fmt.Errorf("ageing a shard by %d days: %w", f.aged, err)
	}
	return nil
}
