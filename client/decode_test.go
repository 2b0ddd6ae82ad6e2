package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestSendReportsReplay(t *testing.T) {
	for _, replayed := range []bool{false, true} {
		f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) { createdAnswer(w, replayed) })
		rc, err := newTestClient(t, f.URL).Send(context.Background(), testTransfer())
		if err != nil {
			t.Fatal(err)
		}
		want := TransferRecord{ID: "1d65d16c18855fc71604d62cd89294d7da18490cdc8316fa", Src: 8842, Dst: 1190, Amount: 2500, Currency: "EUR"}
		if rc.Replayed != replayed || rc.Location != "/transfers/"+want.ID || rc.Attempts != 1 || rc.Transfer.ID != want.ID ||
			rc.Transfer.Src != want.Src || rc.Transfer.Dst != want.Dst || rc.Transfer.Amount != want.Amount || rc.Transfer.Currency != want.Currency {
			t.Errorf("replayed=%t: receipt %+v", replayed, rc)
		}
	}
}

func TestTransferRecordDecodesNewFieldsLeniently(t *testing.T) {
	const body = `{"id":"ab","src":1,"dst":2,"amount":3,"currency":"EUR","reference":"r",
		"created_at":"2026-12-02T13:35:02.656619Z","credit":{"state":"settled","settled_at":"2026-12-02T13:35:03Z","leg":"in"},
		"status":"settled","settled_at":"2026-12-02T13:35:03Z","credit_shard":"shard-1","legs":[1,2]}`
	var rec TransferRecord
	if err := json.Unmarshal([]byte(body), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID != "ab" || rec.Reference != "r" || !rec.CreatedAt.Equal(time.Date(2026, 12, 2, 13, 35, 2, 656619000, time.UTC)) {
		t.Errorf("record %+v", rec)
	}
	if rec.Credit == nil || rec.Credit.State != CreditSettled || !rec.Credit.SettledAt.Equal(time.Date(2026, 12, 2, 13, 35, 3, 0, time.UTC)) {
		t.Errorf("credit %+v", rec.Credit)
	}
	// Top-level status and settled_at are not served: until this package knows them, they are
	// extra, like any other new field.
	if len(rec.Extra) != 4 || string(rec.Extra["credit_shard"]) != `"shard-1"` || string(rec.Extra["legs"]) != `[1,2]` ||
		string(rec.Extra["status"]) != `"settled"` || string(rec.Extra["settled_at"]) != `"2026-12-02T13:35:03Z"` {
		t.Errorf("extra fields %v", rec.Extra)
	}
	rec = TransferRecord{}
	if err := json.Unmarshal([]byte(`{"id":"ab","src":1,"dst":2,"amount":3,"currency":"EUR"}`), &rec); err != nil || rec.Extra != nil ||
		!rec.CreatedAt.IsZero() || rec.Credit != nil {
		t.Errorf("a record without new fields: %+v, %v", rec, err)
	}
	// A state this package does not know is kept, not refused.
	rec = TransferRecord{}
	if err := json.Unmarshal([]byte(`{"id":"ab","src":1,"dst":2,"amount":3,"currency":"EUR","credit":{"state":"reversed"}}`), &rec); err != nil ||
		rec.Credit == nil || rec.Credit.State != "reversed" || !rec.Credit.SettledAt.IsZero() {
		t.Errorf("a credit in a new state: %+v, %v", rec.Credit, err)
	}
}

// TestTransferRecordRoundTrips checks that a record stored as JSON (a receipt kept with its
// operation, say) reads back the same, credit included, and that a receipt's record has none.
func TestTransferRecordRoundTrips(t *testing.T) {
	for _, rec := range []TransferRecord{
		{ID: "ab", Src: 1, Dst: 2, Amount: 3, Currency: "EUR"},
		{ID: "ab", Src: 1, Dst: 2, Amount: 3, Currency: "EUR", CreatedAt: time.Date(2026, 12, 2, 13, 35, 2, 0, time.UTC),
			Credit: &Credit{State: CreditSettled, SettledAt: time.Date(2026, 12, 2, 13, 35, 3, 0, time.UTC)}},
	} {
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Credit == nil && strings.Contains(string(b), "credit") {
			t.Errorf("%s: a record without credit encodes one", b)
		}
		var back TransferRecord
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.ID != rec.ID || !back.CreatedAt.Equal(rec.CreatedAt) || (back.Credit == nil) != (rec.Credit == nil) ||
			rec.Credit != nil && (back.Credit.State != rec.Credit.State || !back.Credit.SettledAt.Equal(rec.Credit.SettledAt)) || back.Extra != nil {
			t.Errorf("%s read back as %+v", b, back)
		}
	}
}

func TestProblemFrom(t *testing.T) {
	h := http.Header{}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Retry-After", "2")
	p := problemFrom(503, h, []byte(`{"type":"https://shardgate.dev/problems/shard-busy","title":"busy","status":503,"detail":"retry","future":true}`))
	want := Problem{Type: ProblemBase + "shard-busy", Title: "busy", Status: 503, Detail: "retry", RetryAfter: 2 * time.Second}
	if *p != want {
		t.Errorf("problem %+v, want %+v", *p, want)
	}
	if got := p.Error(); got != "shardgate: 503 shard-busy: busy: retry" {
		t.Errorf("Error() = %q", got)
	}

	// The router's mux answers an unknown path in plain text; a proxy may answer in HTML.
	h = http.Header{}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	p = problemFrom(404, h, []byte("404 page not found\n"))
	if p.Type != "about:blank" || p.Status != 404 || p.Title != "Not Found" || p.Detail != "404 page not found" {
		t.Errorf("plain-text answer: %+v", p)
	}
	p = problemFrom(502, http.Header{}, []byte(strings.Repeat("x", 1000)))
	if len(p.Detail) > maxSnippet+len("…") {
		t.Errorf("detail of %d bytes", len(p.Detail))
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"Wed, 02 Dec 2026 13:00:30 GMT", 30 * time.Second, true},
		{"Wednesday, 02-Dec-26 13:01:00 GMT", time.Minute, true}, // RFC 850, still to be accepted
		{"Wed, 02 Dec 2026 12:00:00 GMT", 0, true},               // in the past: no wait
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %t; want %s, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNewKeyIsAFreshUUIDv7(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		u, err := uuid.Parse(k)
		if err != nil || u.Version() != 7 || u.String() != k {
			t.Fatalf("key %q is not a canonical UUIDv7 (%v)", k, err)
		}
		sec, nsec := u.Time().UnixTime()
		if age := time.Since(time.Unix(sec, nsec)); age < 0 || age > time.Minute {
			t.Fatalf("key %q carries a time %s away from now", k, age)
		}
		if seen[k] {
			t.Fatalf("key %q minted twice", k)
		}
		seen[k] = true
	}
	if a, b := NewTransfer(1, 2, 3, "EUR"), NewTransfer(1, 2, 3, "EUR"); a.Key == b.Key {
		t.Error("two identical transfers share a key; they are two operations")
	}
}

func TestKeyHeaderIsAnSFString(t *testing.T) {
	for key, want := range map[string]string{
		"0196f1c2-7c1e-7abc-8def-0123456789ab": `"0196f1c2-7c1e-7abc-8def-0123456789ab"`,
		`a"b\c`:                                `"a\"b\\c"`,
	} {
		if got := keyHeader(key); got != want {
			t.Errorf("keyHeader(%q) = %s, want %s", key, got, want)
		}
	}
}

// TestProblemTypesExistOnTheServer keeps the sentinels' type URIs in step with the router's
// problem table.
func TestProblemTypesExistOnTheServer(t *testing.T) {
	src, err := os.ReadFile("../router/problem.go")
	if err != nil {
		t.Skipf("the router's problem table is not where it was: %v", err)
	}
	for _, typ := range []string{TypeKeyReused, TypeKeyExpired} {
		if slug := strings.TrimPrefix(typ, ProblemBase); !strings.Contains(string(src), `"`+slug+`"`) {
			t.Errorf("router/problem.go has no problem %q", slug)
		}
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	if _, err := New("localhost:8080"); err == nil {
		t.Error("a base URL without scheme was accepted")
	}
	p := DefaultRetryPolicy()
	p.MaxAttempts, p.BaseDelay, p.BudgetRatio = 0, 0, -1
	_, err := New("http://localhost:8080", WithRetryPolicy(p))
	for _, field := range []string{"MaxAttempts", "BaseDelay", "BudgetRatio"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
}

func TestBackoffStaysUnderItsCeiling(t *testing.T) {
	p := RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}
	for n, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 200: time.Second} {
		var longest time.Duration
		for range 500 {
			d := p.backoff(n)
			if d < 0 || d >= ceiling {
				t.Fatalf("backoff(%d) = %s, outside [0, %s)", n, d, ceiling)
			}
			longest = max(longest, d)
		}
		if longest < ceiling/2 {
			t.Errorf("backoff(%d) never exceeded %s in 500 draws; the jitter should spread over [0, %s)", n, longest, ceiling)
		}
	}
	prob := &Problem{Status: 503, RetryAfter: 10 * time.Second}
	if d := p.wait(1, prob); d < 10*time.Second || d > 11*time.Second {
		t.Errorf("wait with Retry-After 10s = %s", d)
	}
	if d := p.wait(1, errors.New("connection reset")); d >= 100*time.Millisecond {
		t.Errorf("wait after a network error = %s", d)
	}
}
