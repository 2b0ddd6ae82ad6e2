// Package integration runs shardgate against several real PostgreSQL shards started by the test
// binary itself, with the router in-process behind an httptest server.
package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/api"
	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardgatetest"
	"github.com/shardgate/shardgate/shardmap"
)

// numShards is how many PostgreSQL shards the suite runs against.
const numShards = 2

// prompt bounds an answer that must not wait for a stuck attempt, a held lock or a full pool:
// such a wait lasts until the lock is released or shard_pool.request_timeout (10s), while a
// prompt answer, even under -race on a busy machine, comes well within this.
const prompt = 3 * time.Second

// shardPassword is shard-0's password, so that tests can prove it never reaches an answer (and
// TestMain that no shard's password reaches a log).
var shardPassword string

// env is the suite's shared fixture, built once in TestMain.
var env struct {
	dir     string
	shards  *shardgatetest.ShardSet
	servers []shardgatetest.Shard // shards.Shards
	mapPath string
	m       *shardmap.Map
	pools   map[string]*pgxpool.Pool // direct connections for assertions
	cfg     *config.Config
	svc     *service.Service // the suite's router; its relay runs only when a test calls svc.Relay.Pass
	srv     *router.Server
	url     string
	log     *slog.Logger       // every router's log, kept in logs
	logs    testkit.SyncBuffer // checked for secrets after the run
	api     *api.Validator     // doAt checks every answer against api/openapi.yaml
}

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := setup(m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration setup: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "shardgate-it-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	env.dir = dir
	if env.api, err = api.NewResponseValidator(); err != nil {
		return 0, err
	}
	// The backend (local processes or containers) comes from SHARDGATE_TEST_BACKEND; see
	// shardgatetest.ChooseBackend.
	env.shards, err = shardgatetest.StartShards(ctx, "", numShards)
	if err != nil {
		// A test that cannot reach a server tests nothing: only where no backend can run and CI
		// is unset is that a skip.
		if shardgatetest.CanSkip(err) {
			fmt.Fprintf(os.Stderr, "SKIP integration tests: %v\n", err)
			return 0, nil
		}
		return 0, fmt.Errorf("starting the shards: %w", err)
	}
	defer env.shards.Close()
	env.servers = env.shards.Shards
	shardPassword = env.servers[0].Password()

	if err := prepareShards(ctx, dir); err != nil {
		return 0, err
	}
	env.pools = map[string]*pgxpool.Pool{}
	for _, s := range env.m.Shards {
		if env.pools[s.Name], err = pgxpool.New(ctx, s.DSN); err != nil {
			return 0, err
		}
		defer env.pools[s.Name].Close()
	}
	var logOut io.Writer = &env.logs
	if testing.Verbose() {
		logOut = io.MultiWriter(&env.logs, os.Stderr)
	}
	env.log = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := service.New(env.cfg, env.m, env.log)
	if err != nil {
		return 0, err
	}
	if svc.Relay == nil {
		return 0, fmt.Errorf("the suite's router.yaml turned the relay off; the credit tests need it")
	}
	env.svc, env.srv = svc, svc.Router
	hs := httptest.NewServer(env.srv)
	defer hs.Close()
	defer svc.Close()
	env.url = hs.URL
	code := m.Run()
	if leaked := secretsIn(env.logs.String()); len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the router's logs contain secrets: %v\n", leaked)
		return 1, nil
	}
	return code, nil
}

// prepareShards writes the suite's router.yaml and a map splitting the keyspace over the two
// shards into dir, and migrates the shards as `router migrate` would.
func prepareShards(ctx context.Context, dir string) error {
	env.mapPath = filepath.Join(dir, "shardmap.yaml")
	if err := writeMap(env.mapPath, 1, []string{"-80", "80-"}); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(routerYAML), 0o600); err != nil {
		return err
	}
	var err error
	if env.cfg, env.m, err = service.Load(cfgPath); err != nil {
		return err
	}
	return service.Migrate(ctx, env.cfg, env.m, io.Discard)
}

// secretsIn returns which configured secrets (shard passwords, client tokens) occur in logs.
func secretsIn(logs string) []string {
	secrets := []string{"token-a", "token-b", "admin-token"}
	for _, s := range env.servers {
		secrets = append(secrets, s.Password())
	}
	var leaked []string
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			leaked = append(leaked, fmt.Sprintf("%q", s))
		}
	}
	return leaked
}

// Two clients, so scoping can be tested: tokens "token-a" and "token-b".
const routerYAML = `listen: 127.0.0.1:0
shardmap: shardmap.yaml
idempotency:
  retention: 720h
  partition_interval: 24h
  replay_window: 168h
  in_progress_retry_after: 1s
auth:
  mode: tokens
  clients:
    - name: client-a
      token_sha256: a70bf50e531ce1a817561f2f5d5b6645d4e806becf58ccc5e8cf6b8045a090a8
    - name: client-b
      token_sha256: 49e2bb7eab54cf09b409ffafd3fa8a8a955a60eb972faacaefbed3dbd3207132
shard_pool:
  max_conns: 20
  max_waiting: 1000 # the guide's verification sends 480 requests at once
  connect_timeout: 5s
  request_timeout: 10s
  retry_after: 2s
`

// writeMap writes a shard map giving shard-i the comma-separated ranges[i] (none if empty; a
// shard past the end of ranges is left out of the map). dsnSuffix is
// appended to every DSN (a way to change DSNs without changing servers).
func writeMap(path string, version int, ranges []string, dsnSuffix ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nshards:\n", version)
	for i, s := range env.servers[:len(ranges)] {
		var quoted []string
		for _, r := range strings.Split(ranges[i], ",") {
			if r != "" { // "" leaves the shard drained: ranges: []
				quoted = append(quoted, fmt.Sprintf("%q", r))
			}
		}
		fmt.Fprintf(&b, "  - name: shard-%d\n    dsn: %s%s\n    ranges: [%s]\n", i, s.DSN(), strings.Join(dsnSuffix, ""), strings.Join(quoted, ", "))
	}
	// Write and rename, as an operator's editor or a ConfigMap update would: a reader never sees
	// half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// newRouter serves another in-process router reading the shard map at mapPath, as a second
// replica would. It returns the router and its base URL.
func newRouter(t testing.TB, mapPath string, adjust ...func(*config.Config)) (*router.Server, string) {
	t.Helper()
	cfg := *env.cfg
	cfg.ShardmapPath = mapPath
	for _, f := range adjust {
		f(&cfg)
	}
	m, err := shardmap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(&cfg, m, env.log)
	if err != nil {
		t.Fatal(err)
	}
	srv := svc.Router
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.Close()
		svc.Close()
	})
	return srv, hs.URL
}

// newKey returns a fresh idempotency key.
func newKey() string {
	return rand.Text()
}

// reply is an HTTP response with its body read.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	json.Unmarshal(r.body, &p) //nolint:errcheck // an empty type fails the caller's assertion
	return strings.TrimPrefix(p.Type, router.ProblemBase)
}

// do sends one request to the suite's router as client-a unless headers say otherwise.
func do(t testing.TB, method, path string, headers map[string]string, body string) reply {
	t.Helper()
	return doAt(t, env.url, method, path, headers, body)
}

// doAt is do against the router at base.
func doAt(t testing.TB, base, method, path string, headers map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer token-a")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// Every answer the suite sees must be one api/openapi.yaml describes.
	if err := env.api.ValidateResponse(req, resp.StatusCode, resp.Header, b); err != nil {
		t.Errorf("the answer departs from the API document: %v\nbody: %s", err, b)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// postAt sends POST /transfers with key as client-a to the router at base.
func postAt(t testing.TB, base, key, body string) reply {
	t.Helper()
	return doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, body)
}

// post is postAt the suite's main router.
func post(t testing.TB, key, body string) reply {
	t.Helper()
	return postAt(t, env.url, key, body)
}

func transferBody(src, dst, amount int64) string {
	return fmt.Sprintf(`{"src": %d, "dst": %d, "amount": %d}`, src, dst, amount)
}

// shardOf names the shard the test map assigns to account.
func shardOf(account int64) string {
	return env.m.Route(account).Shard
}

// ledgerRows counts transfer_out rows of transfer id on shard.
func ledgerRows(t testing.TB, shard, transferID string) int {
	t.Helper()
	var n int
	if err := env.pools[shard].QueryRow(context.Background(),
		"SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'", transferID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// records counts idempotency records of key (any scope) on shard, and how many are completed.
func records(t testing.TB, shard, key string) (all, completed int) {
	t.Helper()
	if err := env.pools[shard].QueryRow(context.Background(),
		"SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM idempotency_record WHERE key = $1", key).Scan(&all, &completed); err != nil {
		t.Fatal(err)
	}
	return all, completed
}

// totals counts all ledger rows and idempotency records on every shard, once every credit the
// suite's router handed off has landed: counts taken before and after a request then differ by
// what that request wrote.
func totals(t testing.TB) (ledger, recs int) {
	t.Helper()
	env.svc.Relay.Wait()
	for _, p := range env.pools {
		var l, r int
		if err := p.QueryRow(context.Background(),
			"SELECT (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM idempotency_record)").Scan(&l, &r); err != nil {
			t.Fatal(err)
		}
		ledger += l
		recs += r
	}
	return ledger, recs
}

// transferID is the id the router gives a transfer of client-a with this key and source.
func transferID(src int64, key string) string {
	return router.TransferID(shardmap.KeyspaceID(src), "client-a:transfer", key)
}

// accountOn returns an account, at or above from, that shard owns.
func accountOn(shard string, from int64) int64 {
	for a := from; ; a++ {
		if shardOf(a) == shard {
			return a
		}
	}
}

func mustLoad(t testing.TB, path string) *shardmap.Map {
	t.Helper()
	m, err := shardmap.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func keyspaceOf(account int64) uint64 { return shardmap.KeyspaceID(account) }

// noReplayCache turns a router's replay cache off, for tests of what the shard decides.
func noReplayCache(c *config.Config) { c.ReplayCache.MaxEntries = 0 }
