package router

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// testServer is a Server over a one-shard map whose shard is at dsn, with its log and metrics
// at hand. No test here needs the shard to answer: a request either fails before routing or
// meets a shard that is down or refuses the router's login.
type testServer struct {
	*Server
	logs *testkit.SyncBuffer
	reg  *prometheus.Registry
}

func newTestServer(t *testing.T, routerYAML, dsn string) *testServer {
	t.Helper()
	cfg, err := config.Parse("router.yaml", []byte(routerYAML))
	if err != nil {
		t.Fatal(err)
	}
	m, err := shardmap.Parse("shardmap.yaml", fmt.Appendf(nil, "version: 1\nshards:\n  - name: s\n    dsn: %s\n    ranges: [\"-\"]\n", dsn), nil)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	logs := &testkit.SyncBuffer{}
	reg := prometheus.NewRegistry()
	return &testServer{Server: New(cfg, topo, slog.New(slog.NewTextHandler(logs, nil)), reg), logs: logs, reg: reg}
}

// downDSN is a shard nothing listens on: connecting is refused at once.
const downDSN = "postgres://u@127.0.0.1:1/db?sslmode=disable&connect_timeout=2"

// refusingShard listens like PostgreSQL and answers every login with a FATAL error of SQLSTATE
// code, as a shard does to a wrong password (28P01), an unknown role or pg_hba refusal (28000),
// a dropped database (3D000) or a full server (53300). pgconn then returns exactly what a real
// refusal gives: a *pgconn.ConnectError wrapping a *pgconn.PgError. It returns the shard's DSN.
func refusingShard(t *testing.T, code string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				for {
					msg, err := be.ReceiveStartupMessage()
					if err != nil {
						return
					}
					switch msg.(type) {
					case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
						if _, err := c.Write([]byte("N")); err != nil {
							return
						}
						continue
					}
					be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: "refused by test shard"})
					be.Flush() //nolint:errcheck // the client may have gone
					return
				}
			})
		}
	})
	return fmt.Sprintf("postgres://u:secret@%s/db?sslmode=disable&connect_timeout=2", ln.Addr())
}

// do serves one request; headers are name, value pairs.
func (ts *testServer) do(method, target, body string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	ts.ServeHTTP(rec, req)
	return rec
}

// problemOf decodes an RFC 9457 answer, failing the test if it is not one.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) problem {
	t.Helper()
	var p problem
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != rec.Code {
		t.Fatalf("problem status %d, HTTP status %d", p.Status, rec.Code)
	}
	return p
}

// wantProblem checks an answer's status, type and Retry-After presence.
func wantProblem(t *testing.T, rec *httptest.ResponseRecorder, pt problemType, retryAfter bool) problem {
	t.Helper()
	p := problemOf(t, rec)
	if rec.Code != pt.status || p.Type != ProblemBase+pt.slug {
		t.Fatalf("got %d %s (%s), want %d %s", rec.Code, p.Type, p.Detail, pt.status, ProblemBase+pt.slug)
	}
	if got := rec.Header().Get("Retry-After") != ""; got != retryAfter {
		t.Fatalf("Retry-After %q, want one: %t", rec.Header().Get("Retry-After"), retryAfter)
	}
	return p
}

const noAuth = "auth:\n  mode: none\n"

const validTransfer = `{"src":8842,"dst":1190,"amount":2500}`

// A shard the router cannot log in to (wrong password, unknown role or database, full) or cannot
// reach at all is unavailable, as readyz says: a retryable 503, never a 500, on every path that
// talks to a shard.
func TestShardLoginRefusedIsUnavailable(t *testing.T) {
	for _, tc := range []struct{ name, dsn string }{
		{"wrong password 28P01", ""},
		{"no such role 28000", ""},
		{"no such database 3D000", ""},
		{"too many connections 53300", ""},
		{"connection refused", downDSN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn
			if dsn == "" {
				dsn = refusingShard(t, tc.name[len(tc.name)-5:])
			}
			ts := newTestServer(t, noAuth, dsn)
			rec := ts.do("POST", "/transfers", validTransfer, "Idempotency-Key", "k1", "Content-Type", "application/json")
			wantProblem(t, rec, probShardUnavailable, true)
			id := TransferID(shardmap.KeyspaceID(8842), "anonymous:transfer", "k1")
			wantProblem(t, ts.do("GET", "/transfers/"+id, ""), probShardUnavailable, true)
			if strings.Contains(ts.logs.String(), "secret") {
				t.Errorf("the log shows the shard's password:\n%s", ts.logs)
			}
		})
	}
}

// The pgconn error values behind each answer: a refused login is a ConnectError wrapping a
// PgError; the same codes unwrapped (a pooled connection's session ended) are no different. Only
// an error the shard raised while running the statement is a 500, and a 500 does not claim to
// know whether the transfer was applied.
func TestShardFailureClassification(t *testing.T) {
	ts := newTestServer(t, noAuth, downDSN)
	pg := func(code string) error {
		return fmt.Errorf("transfer: %w", &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"})
	}
	for _, tc := range []struct {
		name    string
		err     error
		want    problemType
		outcome string
	}{
		{"password", pg("28P01"), probShardUnavailable, outShardUnavailable},
		{"authorization", pg("28000"), probShardUnavailable, outShardUnavailable},
		{"database", pg("3D000"), probShardUnavailable, outShardUnavailable},
		{"too many connections", pg("53300"), probShardUnavailable, outShardUnavailable},
		{"admin shutdown", pg("57P01"), probShardUnavailable, outShardUnavailable},
		{"read only standby", pg("25006"), probShardUnavailable, outShardUnavailable},
		{"serialization", pg("40001"), probShardUnavailable, outShardUnavailable},
		{"not a PgError", errors.New("unexpected EOF"), probShardUnavailable, outShardUnavailable},
		{"no SQLSTATE", &pgconn.PgError{}, probInternal, outError},
		{"migrations missing", pg("42883"), probInternal, outError},
		{"busy", topology.ErrShardBusy, probShardBusy, outShardBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if got := ts.shardFailure(rec, "s", tc.err, retrySameKey); got != tc.outcome {
				t.Errorf("outcome %q, want %q", got, tc.outcome)
			}
			p := wantProblem(t, rec, tc.want, tc.want.status == http.StatusServiceUnavailable)
			if strings.Contains(p.Detail, "not applied") {
				t.Errorf("detail %q claims to know the transfer was not applied", p.Detail)
			}
		})
	}
}

// tokenAuth has one client, "payments-api", with token "client-token", and admin token
// "admin-token".
var tokenAuth = fmt.Sprintf("auth:\n  mode: tokens\n  clients:\n    - name: payments-api\n      token_sha256: %x\nadmin:\n  token_sha256: %x\n",
	sha256.Sum256([]byte("client-token")), sha256.Sum256([]byte("admin-token")))

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string // empty: refused
	}{
		{"canonical", []string{"Bearer tok"}, "tok"},
		{"lower-case scheme", []string{"bearer tok"}, "tok"},
		{"upper-case scheme", []string{"BEARER tok"}, "tok"},
		{"mixed-case scheme", []string{"bEaReR tok"}, "tok"},
		{"several spaces", []string{"Bearer   tok"}, "tok"},
		{"missing", nil, ""},
		{"empty", []string{""}, ""},
		{"scheme only", []string{"Bearer"}, ""},
		{"scheme and space", []string{"Bearer "}, ""},
		{"other scheme", []string{"Basic dG9rOg=="}, ""},
		{"scheme prefix", []string{"Bearertok"}, ""},
		{"two headers", []string{"Bearer tok", "Bearer tok"}, ""},
		{"two headers, second empty", []string{"Bearer tok", ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.values {
				h.Add("Authorization", v)
			}
			got, err := bearerToken(h)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted %q as token %q", tc.values, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// The client and the admin token are read by the same rules: the scheme in any case, and two
// Authorization headers are refused (401) rather than one of them picked.
func TestAuthorizationHeader(t *testing.T) {
	ts := newTestServer(t, tokenAuth, downDSN)
	const body = `{"src":1,"dst":2,"amount":3}`
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		// Admitted: the request goes on to the missing Idempotency-Key.
		rec := ts.do("POST", "/transfers", body, "Authorization", scheme+" client-token")
		wantProblem(t, rec, probMissingKey, false)
		if rec := ts.do("GET", "/admin/shardmap", "", "Authorization", scheme+" admin-token"); rec.Code != http.StatusOK {
			t.Errorf("admin with %q: %d %s", scheme, rec.Code, rec.Body)
		}
	}
	for _, tc := range []struct{ name, method, target, token string }{
		{"client", "POST", "/transfers", "client-token"},
		{"admin", "GET", "/admin/shardmap", "admin-token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, second := range []string{"Bearer " + tc.token, "Bearer wrong"} {
				rec := ts.do(tc.method, tc.target, body, "Authorization", "Bearer "+tc.token, "Authorization", second)
				p := wantProblem(t, rec, probUnauthorized, false)
				if !strings.Contains(p.Detail, "exactly one Authorization header") {
					t.Errorf("detail %q does not say to send one Authorization header", p.Detail)
				}
				if !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer ") {
					t.Errorf("no Bearer challenge: %q", rec.Header().Get("WWW-Authenticate"))
				}
			}
			wantProblem(t, ts.do(tc.method, tc.target, body, "Authorization", "Bearer wrong"), probUnauthorized, false)
			wantProblem(t, ts.do(tc.method, tc.target, body, "Authorization", "Basic "+tc.token), probUnauthorized, false)
		})
	}
}

// Requests refused before routing never reach a shard (the one here is down, so reaching it
// would be a 503) and are counted by why: key_expired for a UUIDv7 key older than retention,
// rejected for the rest.
func TestRefusedBeforeRouting(t *testing.T) {
	ts := newTestServer(t, tokenAuth, downDSN)
	auth := []string{"Authorization", "Bearer client-token", "Content-Type", "application/json"}
	old := "00000000-0000-7000-8000-000000000000" // a UUIDv7 of 1970
	future := "ffffffff-ffff-7fff-bfff-ffffffffffff"
	for _, tc := range []struct {
		name    string
		headers []string
		body    string
		want    problemType
		outcome string
	}{
		{"no token", []string{"Idempotency-Key", "k"}, validTransfer, probUnauthorized, outRejected},
		{"no key", auth, validTransfer, probMissingKey, outRejected},
		{"two keys", append([]string{"Idempotency-Key", "a", "Idempotency-Key", "b"}, auth...), validTransfer, probInvalidKey, outRejected},
		{"bad key", append([]string{"Idempotency-Key", `"a`}, auth...), validTransfer, probInvalidKey, outRejected},
		{"form", []string{"Idempotency-Key", "k", "Authorization", "Bearer client-token", "Content-Type", "application/x-www-form-urlencoded"}, validTransfer, probMediaType, outRejected},
		{"bad body", append([]string{"Idempotency-Key", "k"}, auth...), `{"src":1}`, probInvalidBody, outRejected},
		{"key from the future", append([]string{"Idempotency-Key", future}, auth...), validTransfer, probInvalidKey, outRejected},
		{"expired key", append([]string{"Idempotency-Key", old}, auth...), validTransfer, probKeyExpired, outKeyExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counterValue(t, ts.metrics.transfers.WithLabelValues(tc.outcome, ""))
			wantProblem(t, ts.do("POST", "/transfers", tc.body, tc.headers...), tc.want, false)
			if got := counterValue(t, ts.metrics.transfers.WithLabelValues(tc.outcome, "")) - before; got != 1 {
				t.Errorf("shardgate_transfers_total{outcome=%q} went up by %v, want 1", tc.outcome, got)
			}
		})
	}
}

// counterValue reads one counter of a vector.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A key whose debit is in the ledger but whose record is missing is an inconsistency the client
// cannot fix and must not work around with a new key: a retryable 503 of its own type, logged
// as an error naming shard and scope (never the token), counted apart.
func TestRecordMissing(t *testing.T) {
	ts := newTestServer(t, tokenAuth+"idempotency:\n  retention: 100h\n  replay_window: 50h\n", downDSN)
	r := httptest.NewRequest("POST", "/transfers", strings.NewReader(validTransfer))
	r.Header.Set("Authorization", "Bearer client-token")
	r.Header.Set("Idempotency-Key", "k1")
	a, rej := ts.admit(httptest.NewRecorder(), r)
	if rej != nil {
		t.Fatalf("refused: %+v", rej)
	}
	req := ts.buildRequest(r, a)
	if req.Retention != 100*time.Hour {
		t.Errorf("the shard is asked with retention %s, want the configured 100h", req.Retention)
	}
	rec := httptest.NewRecorder()
	if got := ts.answer(rec, "s", 1, req, idem.TransferResult{Outcome: idem.RecordMissing}, nil); got != outRecordMissing {
		t.Errorf("outcome label %q, want %q", got, outRecordMissing)
	}
	p := wantProblem(t, rec, probRecordMissing, true)
	for _, want := range []string{"applied earlier", "not retry with a new Idempotency-Key", "same key"} {
		if !strings.Contains(p.Detail, want) {
			t.Errorf("detail %q does not contain %q", p.Detail, want)
		}
	}
	if got := counterValue(t, ts.metrics.recordsMissing.WithLabelValues("s")); got != 1 {
		t.Errorf("shardgate_idempotency_records_missing_total{shard=s} = %v, want 1", got)
	}
	logs := ts.logs.String()
	for _, want := range []string{"level=ERROR", "shard=s", "scope=payments-api:transfer", "transfer_id=" + req.TransferID} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "client-token") {
		t.Errorf("log shows the client's token:\n%s", logs)
	}
}

// countingReader counts what is read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A body over transfers.max_body_bytes is 413 whatever it holds, even when what fits is already
// not JSON, and whether its length is announced (refused unread) or not (chunked).
func TestBodyOverLimit(t *testing.T) {
	ts := newTestServer(t, noAuth+"transfers:\n  max_body_bytes: 1024\n", downDSN)
	pad := func(s string, n int) string { return s + strings.Repeat(" ", n-len(s)) }
	for _, tc := range []struct {
		name    string
		body    string
		chunked bool
		want    problemType
	}{
		{"broken at once, length announced", "x" + strings.Repeat("y", 2000), false, probTooLarge},
		{"broken at once, chunked", "x" + strings.Repeat("y", 2000), true, probTooLarge},
		{"trailing padding, chunked", pad(validTransfer, 2000), true, probTooLarge},
		{"unknown field first, chunked", `{"x":"` + strings.Repeat("y", 2000) + `"}`, true, probTooLarge},
		{"one byte over, chunked", pad("x", 1025), true, probTooLarge},
		{"at the limit, broken", pad("x", 1024), true, probInvalidBody},
		{"at the limit, valid", pad(validTransfer, 1024), false, probShardUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingReader{r: strings.NewReader(tc.body)}
			req := httptest.NewRequest("POST", "/transfers", body)
			req.ContentLength = int64(len(tc.body))
			if tc.chunked {
				req.ContentLength = -1
			}
			req.Header.Set("Idempotency-Key", "k1")
			rec := httptest.NewRecorder()
			ts.ServeHTTP(rec, req)
			wantProblem(t, rec, tc.want, tc.want == probShardUnavailable)
			if !tc.chunked && tc.want == probTooLarge && body.n > 0 {
				t.Errorf("read %d bytes of a body whose Content-Length is already over the limit", body.n)
			}
			if tc.chunked && body.n > 1025 {
				t.Errorf("read %d bytes; one past the limit (1025) is enough to know", body.n)
			}
		})
	}
}

// With Expect: 100-continue and a Content-Length over the limit the client hears 413 at once: it
// is never invited to send the body. net/http sends 100 Continue only when the handler first
// reads the body, so this checks the first status line on the wire.
func TestExpectContinueOverLimit(t *testing.T) {
	ts := newTestServer(t, noAuth+"transfers:\n  max_body_bytes: 1024\n", downDSN)
	srv := httptest.NewServer(ts)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a failure shows as a read error
	if _, err := io.WriteString(c, "POST /transfers HTTP/1.1\r\nHost: shardgate\r\nIdempotency-Key: k1\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 413 ") {
		t.Fatalf("first status line %q, want 413", line)
	}
}

// Only UTF-8 JSON is accepted: application/json with no charset or charset=utf-8 (any case).
func TestContentType(t *testing.T) {
	ts := newTestServer(t, noAuth, downDSN)
	for _, tc := range []struct {
		ct     string
		refuse string // substring of the 415 detail; empty: accepted (and then meets the down shard)
	}{
		{"", ""},
		{"application/json", ""},
		{"APPLICATION/JSON", ""},
		{"application/json; charset=utf-8", ""},
		{"application/json;charset=UTF-8", ""},
		{`application/json; charset="Utf-8"`, ""},
		{"application/json; charset=latin1", `UTF-8 JSON, not charset "latin1"`},
		{"application/json; charset=iso-8859-1", `UTF-8 JSON, not charset "iso-8859-1"`},
		{"application/json; charset=utf-16", `UTF-8 JSON, not charset "utf-16"`},
		{"application/json; charset=utf8", `UTF-8 JSON, not charset "utf8"`},
		{"application/json; charset=" + strings.Repeat("x", 5000), `"… (5000 characters)`},
		{"application/json; charset=", "send Content-Type: application/json"},
		{"text/plain", "send Content-Type: application/json"},
		{"application/x-www-form-urlencoded", "send Content-Type: application/json"},
	} {
		t.Run(clip(tc.ct), func(t *testing.T) {
			rec := ts.do("POST", "/transfers", validTransfer, "Idempotency-Key", "k1", "Content-Type", tc.ct)
			if tc.refuse == "" {
				wantProblem(t, rec, probShardUnavailable, true)
				return
			}
			if p := wantProblem(t, rec, probMediaType, false); !strings.Contains(p.Detail, tc.refuse) {
				t.Errorf("detail %q does not contain %q", p.Detail, tc.refuse)
			}
		})
	}
}
