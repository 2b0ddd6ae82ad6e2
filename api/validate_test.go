package api

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

const (
	transferID = "1d65d16c18855fc71604d62cd89294d7da18490cdc8316fa"
	created    = `{"id":"` + transferID + `","src":8842,"dst":1190,"amount":2500,"currency":"EUR"}` + "\n"
	// read is the answer to GET /transfers/{id} without its credit, which readCredit adds.
	read    = `{"id":"` + transferID + `","src":8842,"dst":1190,"amount":2500,"currency":"EUR","created_at":"2026-12-02T13:35:02.656619Z"`
	balance = `{"account":8842,"balances":[{"currency":"EUR","balance":-500,"credits":0,"debits":500,"pending_out":500}]}`
)

// readCredit is the answer to GET /transfers/{id} with credit as its credit member.
func readCredit(credit string) string { return read + `,"credit":` + credit + "}\n" }

var jsonHeader = map[string]string{"Content-Type": "application/json"}

// answer is a hand-built response to check.
type answer struct {
	name           string
	method, target string
	status         int
	header         map[string]string
	body           string
	valid          bool
	why            string // for an invalid answer: a fragment the error must contain
}

func problemHeader(extra ...string) map[string]string {
	h := map[string]string{"Content-Type": "application/problem+json", "Cache-Control": "no-store"}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return h
}

func problemBody(slug string, status int) string {
	return `{"type":"` + problemBase + slug + `","title":"t","status":` + strconv.Itoa(status) + `,"detail":"d"}` + "\n"
}

var answers = []answer{
	{name: "created", method: "POST", target: "/transfers", status: 201, valid: true,
		header: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + transferID}, body: created},
	{name: "replayed", method: "POST", target: "/transfers", status: 201, valid: true,
		header: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + transferID, "Idempotent-Replayed": "true"}, body: created},
	{name: "in progress", method: "POST", target: "/transfers", status: 409, valid: true,
		header: problemHeader("Retry-After", "1"), body: problemBody("request-in-progress", 409)},
	{name: "key reused", method: "POST", target: "/transfers", status: 422, valid: true,
		header: problemHeader(), body: problemBody("idempotency-key-reused", 422)},
	{name: "unauthorized", method: "POST", target: "/transfers", status: 401, valid: true,
		header: problemHeader("WWW-Authenticate", `Bearer realm="shardgate"`), body: problemBody("unauthorized", 401)},
	{name: "shard unavailable", method: "POST", target: "/transfers", status: 503, valid: true,
		header: problemHeader("Retry-After", "2"), body: problemBody("shard-unavailable", 503)},
	{name: "get transfer, credit pending", method: "GET", target: "/transfers/" + transferID, status: 200, valid: true,
		header: jsonHeader, body: readCredit(`{"state":"pending"}`)},
	{name: "get transfer, credit settled", method: "GET", target: "/transfers/" + transferID, status: 200, valid: true,
		header: jsonHeader, body: readCredit(`{"state":"settled","settled_at":"2026-12-02T13:35:02.912044Z"}`)},
	{name: "get transfer, internal error", method: "GET", target: "/transfers/" + transferID, status: 500, valid: true,
		header: problemHeader(), body: problemBody("internal-error", 500)},
	{name: "balance", method: "GET", target: "/accounts/8842/balance", status: 200, valid: true, header: jsonHeader, body: balance},
	{name: "balance of an account without rows", method: "GET", target: "/accounts/-3/balance", status: 200, valid: true,
		header: jsonHeader, body: `{"account":-3,"balances":[]}`},
	{name: "balance, invalid account", method: "GET", target: "/accounts/x/balance", status: 400, valid: true,
		header: problemHeader(), body: problemBody("invalid-account", 400)},
	{name: "balance, unauthorized", method: "GET", target: "/accounts/8842/balance", status: 401, valid: true,
		header: problemHeader("WWW-Authenticate", `Bearer realm="shardgate"`), body: problemBody("unauthorized", 401)},
	{name: "balance, range moving", method: "GET", target: "/accounts/8842/balance", status: 503, valid: true,
		header: problemHeader("Retry-After", "1"), body: problemBody("shard-map-changing", 503)},
	{name: "balance, shard busy", method: "GET", target: "/accounts/8842/balance", status: 503, valid: true,
		header: problemHeader("Retry-After", "1"), body: problemBody("shard-busy", 503)},
	{name: "balance, internal error", method: "GET", target: "/accounts/8842/balance", status: 500, valid: true,
		header: problemHeader(), body: problemBody("internal-error", 500)},
	{name: "record missing", method: "POST", target: "/transfers", status: 503, valid: true,
		header: problemHeader("Retry-After", "1"), body: problemBody("idempotency-record-missing", 503)},
	{name: "not ready", method: "GET", target: "/readyz?partial=1", status: 503, valid: true,
		header: map[string]string{"Content-Type": "application/json"}, body: `{"shardmap_version":1,"shards":{"shard-0":"unreachable"}}`},
	{name: "drained shard", method: "GET", target: "/admin/shardmap", status: 200, valid: true,
		header: map[string]string{"Content-Type": "application/json"},
		body:   `{"version":2,"shards":[{"name":"shard-0","dsn":"postgres://u:xxxxx@h/db","ranges":["-"]},{"name":"shard-1","dsn":"postgres://h/db","ranges":null}]}`},
	{name: "route", method: "GET", target: "/admin/route?account=8842", status: 200, valid: true,
		header: map[string]string{"Content-Type": "application/json"},
		body:   `{"account":8842,"keyspace_id":"1d65d16c18855fc7","range":"-80","shard":"shard-0","shardmap_version":1}`},
	{name: "metrics", method: "GET", target: "/metrics", status: 200, valid: true,
		header: map[string]string{"Content-Type": "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"}, body: "up 1\n"},

	{name: "created without id", method: "POST", target: "/transfers", status: 201, why: "id",
		header: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + transferID}, body: `{"src":8842,"dst":1190,"amount":2500,"currency":"EUR"}`},
	{name: "created with a string amount", method: "POST", target: "/transfers", status: 201, why: "amount",
		header: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + transferID}, body: strings.Replace(created, "2500", `"2500"`, 1)},
	{name: "created without Location", method: "POST", target: "/transfers", status: 201, why: "Location",
		header: map[string]string{"Content-Type": "application/json"}, body: created},
	{name: "in progress without Retry-After", method: "POST", target: "/transfers", status: 409, why: "Retry-After",
		header: problemHeader(), body: problemBody("request-in-progress", 409)},
	{name: "422 with a 503 type", method: "POST", target: "/transfers", status: 422, why: "type",
		header: problemHeader(), body: problemBody("shard-busy", 422)},
	{name: "body status differs from the status line", method: "POST", target: "/transfers", status: 409, why: "status",
		header: problemHeader("Retry-After", "1"), body: strings.Replace(problemBody("request-in-progress", 409), "409", "503", 1)},
	{name: "unknown problem type", method: "POST", target: "/transfers", status: 503, why: "type",
		header: problemHeader("Retry-After", "1"), body: problemBody("shard-on-fire", 503)},
	{name: "problem as plain JSON", method: "POST", target: "/transfers", status: 413, why: "application/json",
		header: map[string]string{"Content-Type": "application/json"}, body: problemBody("request-too-large", 413)},
	{name: "undocumented status", method: "POST", target: "/transfers", status: 418, why: "status",
		header: problemHeader(), body: problemBody("internal-error", 418)},
	{name: "undocumented operation", method: "DELETE", target: "/transfers/" + transferID, status: 204, why: "not an operation"},
	{name: "get transfer without its credit", method: "GET", target: "/transfers/" + transferID, status: 200, why: "credit",
		header: jsonHeader, body: read + "}\n"},
	{name: "credit in an unknown state", method: "GET", target: "/transfers/" + transferID, status: 200, why: "state",
		header: jsonHeader, body: readCredit(`{"state":"delivered"}`)},
	{name: "settled credit without settled_at", method: "GET", target: "/transfers/" + transferID, status: 200, why: "settled_at",
		header: jsonHeader, body: readCredit(`{"state":"settled"}`)},
	{name: "pending credit with settled_at", method: "GET", target: "/transfers/" + transferID, status: 200, why: "settled_at",
		header: jsonHeader, body: readCredit(`{"state":"pending","settled_at":"2026-12-02T13:35:02.912044Z"}`)},
	{name: "balance without pending_out", method: "GET", target: "/accounts/8842/balance", status: 200, why: "pending_out",
		header: jsonHeader, body: strings.Replace(balance, `,"pending_out":500`, "", 1)},
	{name: "balance as a string", method: "GET", target: "/accounts/8842/balance", status: 200, why: "balance",
		header: jsonHeader, body: strings.Replace(balance, `"balance":-500`, `"balance":"-500"`, 1)},
	{name: "balance, storage not ready", method: "GET", target: "/accounts/8842/balance", status: 503, why: "type",
		header: problemHeader("Retry-After", "1"), body: problemBody("storage-not-ready", 503)},
	{name: "balance, 503 without Retry-After", method: "GET", target: "/accounts/8842/balance", status: 503, why: "Retry-After",
		header: problemHeader(), body: problemBody("shard-busy", 503)},
	{name: "balance, not found", method: "GET", target: "/accounts/8842/balance", status: 404, why: "status",
		header: problemHeader(), body: problemBody("transfer-not-found", 404)},
	{name: "undocumented account operation", method: "GET", target: "/accounts/8842", status: 200, why: "not an operation",
		header: jsonHeader, body: `{}`},
	{name: "record missing on a read", method: "GET", target: "/transfers/" + transferID, status: 503, why: "type",
		header: problemHeader("Retry-After", "1"), body: problemBody("idempotency-record-missing", 503)},
}

func TestValidateResponse(t *testing.T) {
	v, err := NewResponseValidator()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range answers {
		t.Run(a.name, func(t *testing.T) {
			req := httptest.NewRequest(a.method, "http://127.0.0.1:18081"+a.target, nil)
			h := http.Header{}
			for k, val := range a.header {
				h.Set(k, val)
			}
			err := v.ValidateResponse(req, a.status, h, []byte(a.body))
			switch {
			case a.valid && err != nil:
				t.Errorf("valid response refused: %v", err)
			case !a.valid && err == nil:
				t.Error("invalid response accepted")
			case !a.valid && !strings.Contains(err.Error(), a.why):
				t.Errorf("error does not mention %q: %v", a.why, err)
			}
		})
	}
}
