// Package router is shardgate's HTTP layer: it authenticates the client, validates the
// request, routes it by its source account to the owning shard and answers from what the shard
// decided (applied, replayed, in progress, key reused, expired, unavailable).
package router

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardgate/shardgate/api"
	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/buildinfo"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// Server serves shardgate's HTTP API over the current Topology.
type Server struct {
	cfg      *config.Config
	log      *slog.Logger
	topo     atomic.Pointer[topology.Topology]
	metrics  *metrics
	groups   *committers    // per-shard group commit
	replays  *replayCache   // nil when replay_cache is off
	mux      *http.ServeMux // the API, and the admin endpoints unless they have their own listener
	admin    http.Handler
	reloadMu sync.Mutex
	owed     func(shard string, debit idem.TransferRequest) // called when a debit leaves its credit owed; set by OnCreditOwed

	// For requests whose key range is moving (buffer.go).
	buffer    *rangeBuffer                 // nil when buffering is off
	prevMap   atomic.Pointer[shardmap.Map] // the map served before the current one, if any
	prevFirst rangeHints                   // ranges whose previous owner is asked first
}

// OnCreditOwed makes the server call f, with the debit's shard and request, each time a debit
// applies and leaves its credit owed (its destination lives on another shard): the relay's cue
// to deliver it (relay.Handoff). Call it before serving.
func (s *Server) OnCreditOwed(f func(shard string, debit idem.TransferRequest)) { s.owed = f }

// Commit runs req on shard, whose connections are conn, through that shard's group commit, in
// one statement with the shard's other new transfers: how the relay delivers the credits of
// this router's debits (relay.DeliverThrough).
func (s *Server) Commit(ctx context.Context, shard string, conn *topology.Shard, req idem.TransferRequest) (idem.TransferResult, error) {
	return s.groups.transfer(ctx, shard, conn, req)
}

// New builds a Server serving topo. Metrics are registered on reg and served from it.
func New(cfg *config.Config, topo *topology.Topology, log *slog.Logger, reg *prometheus.Registry) *Server {
	s := &Server{cfg: cfg, log: log, mux: http.NewServeMux()}
	s.topo.Store(topo)
	s.metrics = newMetrics(reg, &s.topo)
	s.buffer = newRangeBuffer(cfg.Buffering, s.metrics.buffer)
	s.groups = newCommitters(cfg, reg)
	s.replays = newReplayCache(cfg.ReplayCache)
	topo.OnIdentityChange(s.identityChanged)
	// Each shard's series exists from the start, so that an alert sees its first change.
	topo.Each(func(name string, _ *topology.Shard) { s.metrics.identities.WithLabelValues(name) })
	s.mux.HandleFunc("POST /transfers", s.postTransfer)
	s.mux.Handle("GET /openapi.yaml", api.Handler())
	s.mux.HandleFunc("GET /transfers/{id}", s.getTransfer)
	s.mux.HandleFunc("GET /accounts/{id}/balance", s.getBalance)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": buildinfo.Version()})
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)

	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	admin.HandleFunc("GET /admin/shardmap", s.adminShardmap)
	admin.HandleFunc("GET /admin/route", s.adminRoute)
	s.admin = admin
	if want := cfg.Admin.TokenSHA256; want != nil {
		s.admin = requireToken(*want, admin)
	}
	if cfg.Admin.Listen == "" {
		s.mux.Handle("GET /metrics", s.admin)
		s.mux.Handle("GET /admin/", s.admin)
	}
	return s
}

// identityChanged handles a shard that is no longer the database it was: the replay cache's
// answers from it may speak of transfers the new database lacks, so they are dropped; the event
// is counted and logged for an operator, who runs reconcile for the shard.
func (s *Server) identityChanged(c topology.IdentityChange) {
	n := s.replays.dropShard(c.Shard)
	s.metrics.identities.WithLabelValues(c.Shard).Inc()
	s.log.Error("SHARD IDENTITY CHANGED: the shard's connections reach another database than before (a promoted standby, a restore); "+
		"transfers acknowledged shortly before may be missing from it: run `router reconcile` for this shard",
		"shard", c.Shard, "old_identity", c.Old.String(), "new_identity", c.New.String(), "replay_cache_entries_dropped", n)
}

// AdminHandler serves /metrics and /admin/*, for the admin listener (config admin.listen).
func (s *Server) AdminHandler() http.Handler { return s.admin }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Topology returns the topology requests are routed with now.
func (s *Server) Topology() *topology.Topology { return s.topo.Load() }

// HoldTopology returns the current topology, held: its pools stay open until release.
func (s *Server) HoldTopology() *topology.Topology {
	for {
		if t := s.topo.Load(); t.Hold() {
			return t
		}
	}
}

// SetTopology swaps in t for new requests and returns the previous one, which requests already
// routed keep using until they finish.
func (s *Server) SetTopology(t *topology.Topology) *topology.Topology {
	prev := s.topo.Swap(t)
	s.mapSwapped(prev.Map)
	return prev
}

var _ http.Handler = (*Server)(nil)

// transferView is the JSON body describing a transfer.
type transferView struct {
	ID        string `json:"id"`
	Src       int64  `json:"src"`
	Dst       int64  `json:"dst"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference,omitempty"`
	CreatedAt string `json:"created_at,omitempty"`
	// Credit is where the credit leg stands; absent from the 201 of POST /transfers, whose body
	// is stored before the credit is decided.
	Credit *creditView `json:"credit,omitempty"`
}

// creditView is the credit leg of a transfer: pending until it is in dst's ledger.
type creditView struct {
	State     string `json:"state"` // pending or settled
	SettledAt string `json:"settled_at,omitempty"`
}

// TransferID derives a transfer's id from its keyspace id and idempotency scope and key: the
// first 16 hex digits route GET /transfers/{id} to the owning shard, the rest are 128 bits of
// SHA-256 over scope and key. Being derived, the same key always gives the same id, and the
// ledger's unique (transfer_id, kind) makes a second debit for one key impossible even after the
// key's idempotency record has expired.
func TransferID(keyspaceID uint64, scope, key string) string {
	var buf [256]byte
	h := sha256.Sum256(append(append(append(buf[:0], scope...), '\n'), key...))
	// The keyspace id as 16 hex digits (big-endian, as %016x writes it), then the hash's first
	// half: in fixed arrays, so that the id is the only allocation.
	var raw [8 + 16]byte
	binary.BigEndian.PutUint64(raw[:8], keyspaceID)
	copy(raw[8:], h[:16])
	var id [2 * len(raw)]byte
	hex.Encode(id[:], raw[:])
	return string(id[:])
}

// parseTransferID returns the keyspace id an id routes by.
func parseTransferID(id string) (uint64, bool) {
	if len(id) != 48 {
		return 0, false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, false
		}
	}
	ks, err := strconv.ParseUint(id[:16], 16, 64)
	return ks, err == nil
}

// Details of the answers to a failed shard call, by what the client should do next.
const (
	retrySameKey = "retry with the same Idempotency-Key; the transfer is never applied twice"
	retryLater   = "retry later"
)

// shardFailure answers a request whose shard call failed and returns the outcome label; retry
// is the detail's advice (retrySameKey for a transfer, retryLater for a read).
//
// A transfer's outcome on the shard is unknown after most failures (it may even have committed
// just before a connection broke), so they are a retryable 503: a retry with the same key then
// replays or applies exactly once. A shard the router cannot connect or log in to is unavailable
// too, as readyz says, even when the cause (a wrong password, a dropped database) lasts until an
// operator acts: the client's request is not at fault and it must be told to come back. Only an
// error the shard raised while running the statement is a 500, and even then the answer does not
// say the transfer was not applied: storage promises no more than "the outcome is not known".
func (s *Server) shardFailure(w http.ResponseWriter, shard string, err error, retry string) string {
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
	)
	isPg := errors.As(err, &pgErr)
	switch {
	case errors.Is(err, topology.ErrShardBusy):
		writeProblem(w, probShardBusy, retry, s.cfg.ShardPool.RetryAfter)
		return outShardBusy
	case errors.Is(err, topology.ErrNotReplicated):
		s.log.Warn("a commit stopped waiting for the shard's synchronous standby (its wait was cancelled on the server); answered as an unknown outcome",
			"shard", shard)
		writeProblem(w, probShardUnavailable, retry, s.cfg.ShardPool.RetryAfter)
		return outShardUnavailable
	case errors.Is(err, idem.ErrNoPartition):
		s.log.Error("idempotency partition missing; transfers on this shard are refused until `router maintain` runs", "shard", shard, "err", err)
		writeProblem(w, probStorageNotReady, retry, s.cfg.ShardPool.RetryAfter)
		return outShardUnavailable
	case isPg && loginRefusedSQLState(pgErr.Code):
		s.log.Error("shard refuses the router's login; fix the shard's DSN or the shard", "shard", shard, "sqlstate", pgErr.Code, "err", err)
	case isPg && !errors.As(err, &connErr) && !transientSQLState(pgErr.Code):
		s.log.Error("shard call failed", "shard", shard, "sqlstate", pgErr.Code, "err", err)
		writeProblem(w, probInternal, "the owning shard failed with an unexpected error; "+retry, 0)
		return outError
	default:
		s.log.Warn("shard unavailable", "shard", shard, "err", err)
	}
	writeProblem(w, probShardUnavailable, retry, s.cfg.ShardPool.RetryAfter)
	return outShardUnavailable
}

// loginRefusedSQLState reports the errors of a shard that answers but will not open a session:
// invalid authorization (wrong password, unknown role, pg_hba) and invalid catalog name (no such
// database). They normally come wrapped in a *pgconn.ConnectError; either way the statement
// never ran.
func loginRefusedSQLState(code string) bool {
	return strings.HasPrefix(code, "28") || strings.HasPrefix(code, "3D")
}

// transientSQLState reports server errors that say "not now" rather than "never": connection
// exceptions, transaction rollbacks (serialization, deadlock), object not in prerequisite state
// (lock timeout), insufficient resources (too many connections), operator intervention
// (shutdown, cancel), system errors, and a read-only transaction (a shard that failed over to a
// standby).
func transientSQLState(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "40", "53", "55", "57", "58":
		return true
	}
	return code == "25006"
}

// writeStored writes a response exactly as stored; a replay adds Idempotent-Replayed: true.
func writeStored(w http.ResponseWriter, resp idem.Response, replayed bool) {
	h := w.Header()
	for k, v := range resp.Headers {
		h.Set(k, v)
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(resp.Status)
	io.WriteString(w, resp.Body) //nolint:errcheck // the client went away; the stored response awaits its retry
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client went away
}

// readyz is ready when a map is loaded and every shard answers within a second. With
// ?partial=1 one reachable shard is enough: a load balancer probing that way keeps routing to
// the healthy shards when one is down, instead of taking every router out at once (a down
// shard's own requests get 503 anyway).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	topo := s.HoldTopology()
	defer topo.Release()
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	status := make(map[string]string, len(topo.Map.Shards))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, sh := range topo.Map.Shards {
		wg.Go(func() {
			res := "ok"
			if err := topo.Pool(sh.Name).Ping(ctx); err != nil {
				res = "unreachable"
			}
			mu.Lock()
			status[sh.Name] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	reachable := 0
	for _, v := range status {
		if v == "ok" {
			reachable++
		}
	}
	code := http.StatusOK
	if reachable == 0 || reachable < len(status) && r.URL.Query().Get("partial") != "1" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"shardmap_version": topo.Map.Version, "shards": status})
}

func (s *Server) adminShardmap(w http.ResponseWriter, _ *http.Request) {
	type shardView struct {
		Name   string   `json:"name"`
		DSN    string   `json:"dsn"`
		Ranges []string `json:"ranges"`
	}
	m := s.topo.Load().Map
	out := struct {
		Version int64       `json:"version"`
		Shards  []shardView `json:"shards"`
	}{Version: m.Version}
	for _, sh := range m.Shards {
		v := shardView{Name: sh.Name, DSN: sh.RedactedDSN()}
		for _, kr := range sh.Ranges {
			v.Ranges = append(v.Ranges, kr.String())
		}
		out.Shards = append(out.Shards, v)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) adminRoute(w http.ResponseWriter, r *http.Request) {
	acct, err := strconv.ParseInt(r.URL.Query().Get("account"), 10, 64)
	if err != nil {
		writeProblem(w, probInvalidAccount, "pass ?account=N with N a 64-bit signed integer", 0)
		return
	}
	m := s.topo.Load().Map
	rt := m.Route(acct)
	writeJSON(w, http.StatusOK, map[string]any{
		"account": rt.Account, "keyspace_id": fmt.Sprintf("%016x", rt.KeyspaceID),
		"range": rt.Range.String(), "shard": rt.Shard, "shardmap_version": m.Version,
	})
}
