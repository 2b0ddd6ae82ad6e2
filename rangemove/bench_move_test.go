package rangemove

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// The bench's maps: range 40-80 moves from sa to sb. It is a range of its own in both, as an
// operator splits a range before moving part of it: a router holds the requests of the range
// its map names, so a move of part of a range would hold the rest with it.
const (
	benchMapBefore = "sa=-40,40-80 sb=80-"
	benchMapAfter  = "sa=-40 sb=40-80,80-"
)

// TestBenchMove is the range-move benchmark (scripts/bench-move.sh, `make bench-move`), run only
// when SHARDGATE_BENCH_MOVE is set to the number of transfers S to seed: S transfers into the
// range 40-80 of shard sa (nine in ten credit an account of the same range, one in ten an
// account of 80- on sb, whose credit is owed), with the rows a router writes for them. The
// shards are servers of their own unless SHARDGATE_BENCH_MOVE_SERVERS is 1 (benchCluster). A
// router (buffering at its defaults) serves the two shards over HTTP from a map file, and
// SHARDGATE_BENCH_MOVE_CLIENTS clients (8 unless set), each posting at most
// SHARDGATE_BENCH_MOVE_RATE transfers a second (50 unless set), half from accounts of 40-80
// and half from -40, retry a 503 after 50 ms with the same key, while 40-80 moves to sb with
// `router shardmap apply --map`, a process of its own as an operator runs it (applyCommand),
// paced at SHARDGATE_BENCH_MOVE_PACE (DefaultPace unless set). The seed is settled first
// (settle). The apply puts the new map file in place once the range is fenced; the router finds
// it through the refusal of the old owner. It prints the apply time and rate, for each range the
// longest time without a 201, the answers that were not 201, and p99 latency (first send to
// 201) before and during the move with their ratio, the servers' checkpoints and WAL, what the
// shards' backends were doing (sampleWaits), and the router's buffering; then it checks every
// row (checkMoved).
func TestBenchMove(t *testing.T) {
	size, _ := strconv.Atoi(os.Getenv("SHARDGATE_BENCH_MOVE"))
	if size <= 0 {
		t.Skip("set SHARDGATE_BENCH_MOVE to the number of transfers to seed")
	}
	clients, rate := envInt("SHARDGATE_BENCH_MOVE_CLIENTS", 8), max(envInt("SHARDGATE_BENCH_MOVE_RATE", 50), 1)
	pace := benchPace(t)
	if d, err := time.ParseDuration(os.Getenv("SHARDGATE_BENCH_MOVE_BEFORE")); err == nil && d > 0 {
		beforeMove = d
	}
	c, servers := benchCluster(t)
	mapPath := filepath.Join(t.TempDir(), "shardmap.yaml")
	dsn := func(name string) string { return c.pool(name).Config().ConnString() }
	c.mustApply(testkit.WriteShardMap(t, mapPath, 1, benchMapBefore, dsn))
	acc := benchAccounts(t)
	seeded := seedMoving(t, c, acc, size)
	settle(t, c, servers)

	rt, reg := benchRouter(t, mapPath)
	srv := httptest.NewServer(rt)
	defer srv.Close()
	load := startLoad(srv.URL, acc, clients, rate)
	waits := sampleWaits(c, "sa", "sb")
	defer waits.stop()
	if clients > 0 {
		time.Sleep(warmUp)
	}
	experiments(t, c, load)
	h0 := routerHistograms(t, reg, "sa")
	if clients > 0 {
		time.Sleep(beforeMove)
	}
	h1 := routerHistograms(t, reg, "sa")
	bg := backgroundWork(t, c, servers)
	next := filepath.Join(filepath.Dir(mapPath), "next.yaml")
	testkit.WriteShardMap(t, next, 2, benchMapAfter, dsn)
	var atGrant serverWork
	moveStart := time.Now()
	niceCtx, stopNice := context.WithCancel(context.Background())
	niceApply(niceCtx, c)
	ap := applyCommand(t, mapPath, next, pace, func() { atGrant = backgroundWork(t, c, servers) })
	moveEnd := time.Now()
	stopNice()
	h2 := routerHistograms(t, reg, "sa")
	if clients > 0 {
		time.Sleep(time.Second)
	}
	load.stop()
	if load.err != nil {
		t.Fatal(load.err)
	}
	granted := ap.granted
	rows := ap.records + ap.ledger + ap.credits
	fmt.Printf("bench-move S=%d clients=%d×%d/s pace=%g: apply %v: granted after %v (%d rows copied: %d records, %d ledger rows, %d owed credits; %.0f rows/s), moved rows deleted from the old owner in %v\n",
		size, clients, rate, pace, moveEnd.Sub(moveStart).Round(time.Millisecond), granted.Sub(moveStart).Round(time.Millisecond), rows, ap.records, ap.ledger, ap.credits,
		float64(rows)/granted.Sub(moveStart).Seconds(), moveEnd.Sub(granted).Round(time.Millisecond))
	load.report(moveStart, granted, moveEnd)
	fmt.Printf("  up to the grant: %s\n", atGrant.since(bg))
	fmt.Printf("  in the purge: %s\n", backgroundWork(t, c, servers).since(atGrant))
	waits.report(moveStart.Add(-beforeMove), moveStart, moveEnd)
	for _, name := range []string{"shardgate_shard_request_duration_seconds", "shardgate_group_commit_wait_seconds"} {
		fmt.Printf("  sa's %s before the move: %s; during: %s\n", name, tails(h0, h1, name, .005, .01, .025), tails(h1, h2, name, .005, .01, .025))
	}
	fmt.Printf("  router buffering: %s\n", bufferSummary(t, reg))
	checkMoved(t, c, mapPath, size, seeded, load.acked)
}

// benchPace is the apply's pace: SHARDGATE_BENCH_MOVE_PACE, or DefaultPace unless set.
func benchPace(t *testing.T) float64 {
	t.Helper()
	v := os.Getenv("SHARDGATE_BENCH_MOVE_PACE")
	if v == "" {
		return DefaultPace
	}
	pace, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("SHARDGATE_BENCH_MOVE_PACE: %v", err)
	}
	return pace
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n >= 0 {
		return n
	}
	return def
}

// benchAccounts returns accounts whose keyspace ids lie in each of the bench's ranges, by range.
func benchAccounts(t *testing.T) map[string][]int64 {
	t.Helper()
	const per = 4096
	out := map[string][]int64{}
	ranges := map[string]shardmap.KeyRange{}
	for _, s := range []string{"-40", "40-80", "80-"} {
		ranges[s] = mustRange(t, s)
	}
	for a := int64(1); len(out["-40"]) < per || len(out["40-80"]) < per || len(out["80-"]) < per; a++ {
		for s, r := range ranges {
			if r.Contains(shardmap.KeyspaceID(a)) && len(out[s]) < per {
				out[s] = append(out[s], a)
			}
		}
	}
	return out
}

// benchInput is transfer i of a client posting from range from: to an account of the same
// range, or for one in ten of those from 40-80 (away), of 80-, whose credit sb owes.
func benchInput(acc map[string][]int64, from string, i int) router.TransferInput {
	r := rand.New(rand.NewPCG(uint64(i), 7))
	n := len(acc[from])
	j := r.IntN(n)
	src, dst := acc[from][j], acc[from][(j+1+r.IntN(n-1))%n] // never the same account
	if from == "40-80" && i%10 == 0 {
		dst = acc["80-"][r.IntN(len(acc["80-"]))]
	}
	return router.TransferInput{Src: src, Dst: dst, Amount: 100, Currency: "EUR"}
}

// routerTransfer is what a router without auth sends its shard for in with key: the rows a
// router writes, written here without one to seed the range fast.
func routerTransfer(key string, in router.TransferInput) idem.TransferRequest {
	scope := config.AnonymousClient + ":transfer"
	ks := shardmap.KeyspaceID(in.Src)
	id := router.TransferID(ks, scope, key)
	return idem.TransferRequest{
		Scope: scope, Key: key, RequestHash: router.Fingerprint(http.MethodPost, "/transfers", in),
		KeyspaceID: ks, DstKeyspaceID: shardmap.KeyspaceID(in.Dst), TransferID: id, Client: config.AnonymousClient,
		Src: in.Src, Dst: in.Dst, Amount: in.Amount, Currency: in.Currency, Retention: 720 * time.Hour,
		Response: idem.Response{Status: http.StatusCreated,
			Headers: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + id},
			Body:    fmt.Sprintf(`{"id":%q,"src":%d,"dst":%d,"amount":%d,"currency":%q}`+"\n", id, in.Src, in.Dst, in.Amount, in.Currency)},
	}
}

// seededKey is a transfer seeded into the moving range.
type seededKey struct {
	key string
	in  router.TransferInput
}

// seedMoving applies size transfers from accounts of 40-80 on sa, in batches from two
// workers, and returns every hundredth of them.
func seedMoving(t *testing.T, c *cluster, acc map[string][]int64, size int) []seededKey {
	t.Helper()
	start := time.Now()
	var (
		mu     sync.Mutex
		sample []seededKey
		wg     sync.WaitGroup
	)
	const group = 500
	for w := range 2 {
		wg.Go(func() {
			for i := w * group; i < size; i += 2 * group {
				var reqs []idem.TransferRequest
				for j := i; j < min(i+group, size); j++ {
					s := seededKey{key: uuid.Must(uuid.NewV7()).String(), in: benchInput(acc, "40-80", j)}
					reqs = append(reqs, routerTransfer(s.key, s.in))
					if j%100 == 0 {
						mu.Lock()
						sample = append(sample, s)
						mu.Unlock()
					}
				}
				res, err := idem.TransferBatch(context.Background(), c.pool("sa"), reqs)
				if err != nil {
					t.Error(err)
					return
				}
				if i := slices.IndexFunc(res, func(r idem.TransferResult) bool { return r.Outcome != idem.Applied }); i >= 0 {
					t.Errorf("seed: %v", res[i].Outcome)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("seeded %d transfers into 40-80 in %v", size, time.Since(start).Round(time.Millisecond))
	return sample
}

// settle lets the seed's aftermath pass before the load begins, so that the p99 before the move
// is the load's own: it vacuums and analyzes both shards (the seed's inserts leave the
// visibility map and the statistics to autovacuum, which would otherwise run while "before" is
// measured) and checkpoints the server (whose dirty buffers the seed filled).
func settle(t *testing.T, c *cluster, servers []string) {
	t.Helper()
	start := time.Now()
	for _, shard := range []string{"sa", "sb"} {
		if _, err := c.pool(shard).Exec(context.Background(), "VACUUM ANALYZE"); err != nil {
			t.Fatalf("%s: vacuum: %v", shard, err)
		}
	}
	for _, shard := range servers {
		if _, err := c.pool(shard).Exec(context.Background(), "CHECKPOINT"); err != nil {
			t.Fatalf("%s: checkpoint: %v", shard, err)
		}
	}
	t.Logf("vacuumed, analyzed and checkpointed in %v", time.Since(start).Round(time.Millisecond))
}

// serverWork counts, on each server (by the shard that names it), its checkpoints and the WAL it
// wrote, and the shards' autovacuum and autoanalyze runs.
type serverWork struct {
	servers           []string
	timed, requested  map[string]int64
	wal               map[string]int64 // pg_current_wal_lsn, in bytes
	vacuums, analyzes int64
}

// backgroundWork counts them now; servers names a shard of each server.
func backgroundWork(t *testing.T, c *cluster, servers []string) serverWork {
	t.Helper()
	w := serverWork{servers: servers, timed: map[string]int64{}, requested: map[string]int64{}, wal: map[string]int64{}}
	for _, shard := range servers {
		var timed, requested, wal int64
		if err := c.pool(shard).QueryRow(context.Background(),
			"SELECT checkpoints_timed, checkpoints_req, pg_current_wal_lsn() - '0/0' FROM pg_stat_bgwriter").Scan(&timed, &requested, &wal); err != nil {
			t.Fatal(err)
		}
		w.timed[shard], w.requested[shard], w.wal[shard] = timed, requested, wal
	}
	for _, shard := range []string{"sa", "sb"} {
		var v, a int64
		if err := c.pool(shard).QueryRow(context.Background(), "SELECT coalesce(sum(autovacuum_count), 0), coalesce(sum(autoanalyze_count), 0) FROM pg_stat_user_tables").Scan(&v, &a); err != nil {
			t.Fatal(err)
		}
		w.vacuums, w.analyzes = w.vacuums+v, w.analyzes+a
	}
	return w
}

// since says what w counts beyond before.
func (w serverWork) since(before serverWork) string {
	var parts []string
	for _, s := range w.servers {
		name := "the server of sa and sb"
		if len(w.servers) > 1 {
			name = s + "'s server"
		}
		parts = append(parts, fmt.Sprintf("%s %d checkpoints timed and %d requested, %.0f MB of WAL", name,
			w.timed[s]-before.timed[s], w.requested[s]-before.requested[s], float64(w.wal[s]-before.wal[s])/1e6))
	}
	return fmt.Sprintf("%s; %d autovacuums and %d autoanalyzes on the two shards", strings.Join(parts, "; "), w.vacuums-before.vacuums, w.analyzes-before.analyzes)
}

// benchRouter is a router without auth over the map file at mapPath, and its registry.
func benchRouter(t *testing.T, mapPath string) (*router.Server, *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse(filepath.Join(filepath.Dir(mapPath), "router.yaml"), []byte("shardmap: "+mapPath+"\nauth:\n  mode: none\n"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := shardmap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rt := router.New(cfg, topo, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), reg)
	t.Cleanup(func() { rt.Topology().Close() })
	return rt, reg
}

// benchLoad is the clients posting transfers to the router while the range moves.
type benchLoad struct {
	halt atomic.Bool
	wg   sync.WaitGroup

	mu       sync.Mutex
	samples  map[bool][]sample // 201s, by whether from the moving range
	non201   map[bool]int      // answers other than 201 (503s, retried), by the same
	replayed int               // 201s that replayed an earlier attempt of their key
	acked    []ackedKey
	err      error
}

// The load runs warmUp (new connections, the router's first groups), then the beforeMove
// whose latency the move's is compared with, before the move begins. A p99 needs samples: over
// 10 s (2,000 transfers of the other range) it came out anywhere from 4.7 to 8.0 ms in runs
// otherwise alike; over 30 s it is the 60th slowest of 6,000. SHARDGATE_BENCH_MOVE_BEFORE (a
// duration) shortens it for the smoke run.
const warmUp = 2 * time.Second

var beforeMove = 30 * time.Second

// timelineStep is the window of the p99 timeline report prints.
const timelineStep = 15 * time.Second

// sample is a 201: when it came, and how long after its key was first sent.
type sample struct {
	at      time.Time
	latency time.Duration
}

// ackedKey is a transfer the router answered 201, with the body it answered.
type ackedKey struct {
	seededKey
	moving bool
	body   string
}

// startLoad starts clients posting to the router at url, each at most rate transfers a second,
// every other one from the moving range.
func startLoad(url string, acc map[string][]int64, clients, rate int) *benchLoad {
	l := &benchLoad{samples: map[bool][]sample{}, non201: map[bool]int{}}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var next atomic.Int64
	pace := time.Second / time.Duration(rate)
	for w := range clients {
		moving := w%2 == 0
		from := map[bool]string{true: "40-80", false: "-40"}[moving]
		l.wg.Go(func() {
			for tick := time.Now(); !l.halt.Load(); tick = tick.Add(pace) {
				time.Sleep(time.Until(tick))
				k := seededKey{key: uuid.Must(uuid.NewV7()).String(), in: benchInput(acc, from, int(next.Add(1)))}
				if err := l.post(client, url, k, moving); err != nil {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
					return
				}
			}
		})
	}
	return l
}

// post sends k until it is answered 201, again after 50 ms with the same key for each 503.
func (l *benchLoad) post(client *http.Client, url string, k seededKey, moving bool) error {
	body, err := json.Marshal(k.in)
	if err != nil {
		return err
	}
	begin := time.Now()
	for time.Since(begin) < time.Minute {
		req, err := http.NewRequest(http.MethodPost, url+"/transfers", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", k.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close() //nolint:errcheck // read to its end already
		if err != nil {
			return err
		}
		switch resp.StatusCode {
		case http.StatusCreated:
			l.mu.Lock()
			defer l.mu.Unlock()
			l.samples[moving] = append(l.samples[moving], sample{time.Now(), time.Since(begin)})
			l.acked = append(l.acked, ackedKey{k, moving, string(got)})
			if resp.Header.Get("Idempotent-Replayed") != "" {
				l.replayed++
			}
			return nil
		case http.StatusServiceUnavailable:
			l.mu.Lock()
			l.non201[moving]++
			l.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("key %s: %d %s", k.key, resp.StatusCode, got)
		}
	}
	return fmt.Errorf("key %s: no 201 in a minute", k.key)
}

// stop stops the clients once their transfers in flight are answered.
func (l *benchLoad) stop() {
	l.halt.Store(true)
	l.wg.Wait()
}

// report prints, for the moving range and the other one, the 201s during the move, the
// longest time without one, the answers that were not 201 over the whole run, and p99 latency
// during the move against before it (beforeMove), with their ratio, and during the move's two
// halves: the copy up to the grant, and the purge after it.
func (l *benchLoad) report(moveStart, granted, moveEnd time.Time) {
	for _, moving := range []bool{true, false} {
		name := map[bool]string{true: "moving range 40-80", false: "other range -40"}[moving]
		var before, during, copying, purging []time.Duration
		gap, last := time.Duration(0), moveStart
		for _, s := range l.samples[moving] {
			switch {
			case s.at.Before(moveStart.Add(-beforeMove)):
			case s.at.Before(moveStart):
				before = append(before, s.latency)
			case !s.at.After(moveEnd):
				during = append(during, s.latency)
				if s.at.Before(granted) {
					copying = append(copying, s.latency)
				} else {
					purging = append(purging, s.latency)
				}
				gap = max(gap, s.at.Sub(last))
				last = s.at
			}
		}
		gap = max(gap, moveEnd.Sub(last))
		ratio := 0.0
		if p := p99(before); p > 0 {
			ratio = float64(p99(during)) / float64(p)
		}
		if !moving {
			// Where in the move the slow answers fell: p99 per 15 s from the start of the move.
			var line []string
			for from := moveStart; from.Before(moveEnd); from = from.Add(timelineStep) {
				var w []time.Duration
				for _, s := range l.samples[moving] {
					if !s.at.Before(from) && s.at.Before(from.Add(timelineStep)) {
						w = append(w, s.latency)
					}
				}
				mark := ""
				if !granted.IsZero() && !granted.Before(from) && granted.Before(from.Add(timelineStep)) {
					mark = "|" // the grant: the purge follows
				}
				line = append(line, fmt.Sprintf("%s%.0f", mark, float64(p99(w))/float64(time.Millisecond)))
			}
			fmt.Printf("  %s: p99 per %v of the move, ms: %s\n", name, timelineStep, strings.Join(line, " "))
		}
		fmt.Printf("  %s: during the move %d answered 201, longest time without one %v, %d answers not 201, p99 %v (before the move %v: %.2fx; to the grant %v, purge %v)\n",
			name, len(during), gap.Round(time.Millisecond), l.non201[moving], p99(during).Round(time.Microsecond), p99(before).Round(time.Microsecond), ratio,
			p99(copying).Round(time.Microsecond), p99(purging).Round(time.Microsecond))
	}
	if l.replayed > 0 {
		fmt.Printf("  %d 201s replayed an earlier attempt of their key\n", l.replayed)
	}
}

// bufferSummary says how the router's holdings of requests for a moving range ended, and how
// long they waited.
func bufferSummary(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, mf := range mfs {
		switch mf.GetName() {
		case "shardgate_buffered_requests_total":
			for _, m := range mf.GetMetric() {
				parts = append(parts, fmt.Sprintf("%s %.0f", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue()))
			}
		case "shardgate_buffered_wait_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			most := "0s"
			for _, b := range h.GetBucket() {
				if b.GetCumulativeCount() == h.GetSampleCount() {
					most = fmt.Sprintf("%gs", b.GetUpperBound())
					break
				}
			}
			parts = append(parts, fmt.Sprintf("%d held, %.3fs in all, each at most %s", h.GetSampleCount(), h.GetSampleSum(), most))
		}
	}
	return strings.Join(parts, ", ")
}

// checkMoved checks every row after the move. A new router on the map file now answers each
// acknowledged key and one in a hundred seeded ones with a replay of its 201, byte for byte
// (and the router wrote exactly the rows that routerTransfer seeds). On each shard every
// record's transfer has one debit and its credit (or owed credit) there, and no debit lacks
// its record; sa keeps no row of 40-80, and sb holds a record for each key of 40-80.
func checkMoved(t *testing.T, c *cluster, mapPath string, size int, seeded []seededKey, acked []ackedKey) {
	t.Helper()
	rt, _ := benchRouter(t, mapPath)
	want := map[seededKey]string{}
	moving := size
	for _, a := range acked {
		want[a.seededKey] = a.body
		if body := routerTransfer(a.key, a.in).Response.Body; body != a.body {
			t.Fatalf("the router answered %q, the seed writes %q", a.body, body)
		}
		if a.moving {
			moving++
		}
	}
	for _, s := range seeded {
		want[s] = routerTransfer(s.key, s.in).Response.Body
	}
	replayAll(t, rt, want)
	checkRows(t, c, moving)
}

// replayAll posts every key of want to rt, from four clients at once, and checks each is
// answered with a replay of its body.
func replayAll(t *testing.T, rt *router.Server, want map[seededKey]string) {
	t.Helper()
	keys := make(chan seededKey)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for k := range keys {
				in, err := json.Marshal(k.in)
				if err != nil {
					panic(err) // four integers and a currency code
				}
				req := httptest.NewRequest(http.MethodPost, "/transfers", bytes.NewReader(in))
				req.Header.Set("Idempotency-Key", k.key)
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				rt.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") == "" || rec.Body.String() != want[k] {
					if failed.Add(1) <= 10 {
						t.Errorf("retry of %s after the move: %d %s (replayed %q), want a replay of %s", k.key, rec.Code, rec.Body, rec.Header().Get("Idempotent-Replayed"), want[k])
					}
				}
			}
		})
	}
	for k := range want {
		keys <- k
	}
	close(keys)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d keys did not replay", n, len(want))
	}
}

// checkRows checks the rows on each shard, as checkMoved says; sb must hold moving records.
func checkRows(t *testing.T, c *cluster, moving int) {
	t.Helper()
	ctx := context.Background()
	lo, hi := idem.Bounds(mustRange(t, "40-80"))
	for _, shard := range []string{"sa", "sb"} {
		var bad, debits, records, left int
		err := c.pool(shard).QueryRow(ctx, `SELECT
			(SELECT count(*) FROM (SELECT (response->>'body')::jsonb->>'id' AS id FROM idempotency_record) r
			  WHERE (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = r.id AND l.kind = 'transfer_out') <> 1
			     OR (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = r.id AND l.kind = 'transfer_in')
			      + (SELECT count(*) FROM shardgate_credit_outbox o WHERE o.transfer_id = r.id AND o.settled_at IS NULL) <> 1),
			(SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out'),
			(SELECT count(*) FROM idempotency_record),
			(SELECT count(*) FROM idempotency_record WHERE `+inRange+`)
			  + (SELECT count(*) FROM ledger_entries WHERE `+inRange+`) + (SELECT count(*) FROM shardgate_credit_outbox WHERE `+inRange+`)`,
			lo, hi).Scan(&bad, &debits, &records, &left)
		switch {
		case err != nil:
			t.Fatalf("%s: %v", shard, err)
		case bad != 0 || debits != records:
			t.Errorf("%s: %d records without one debit and its credit; %d debits for %d records", shard, bad, debits, records)
		case shard == "sa" && left != 0:
			t.Errorf("sa keeps %d rows of 40-80 after the move", left)
		case shard == "sb" && records != moving:
			t.Errorf("sb holds %d records, want %d (seeded and acknowledged in 40-80)", records, moving)
		}
	}
}

// benchTransfer is transfer i for the online tests: from an account in 40-80 (moving) or in
// -40, to one in 40-80, or in 80- (owed: on sb) when away.
func benchTransfer(i int, moving, away bool) idem.TransferRequest {
	r := rand.New(rand.NewPCG(uint64(i), 7))
	ks := r.Uint64() >> 2 // in -40
	if moving {
		ks |= 1 << 62 // in 40-80
	}
	dst := r.Uint64()>>2 | 1<<62
	if away {
		dst = r.Uint64()>>1 | 1<<63
	}
	key := uuid.Must(uuid.NewV7()).String()
	return idem.TransferRequest{
		Scope: "bench:transfer", Key: key, RequestHash: fmt.Sprintf("h-%d", i),
		KeyspaceID: ks, DstKeyspaceID: dst, TransferID: "t-" + key, Client: "bench",
		Src: int64(i), Dst: int64(i + 1), Amount: 100, Currency: "EUR", Retention: 720 * time.Hour,
		Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Sprintf(`{"id":"t-%s"}`, key)},
	}
}

func mustRange(t *testing.T, s string) shardmap.KeyRange {
	t.Helper()
	r, err := shardmap.ParseKeyRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}
