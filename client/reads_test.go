package client

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestGetTransfer(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			problemAnswer(w, http.StatusServiceUnavailable, "shard-unavailable", "")
			return
		}
		if r.URL.Path != "/transfers/ab12" {
			problemAnswer(w, http.StatusNotFound, "transfer-not-found", "")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"ab12","src":8842,"dst":1190,"amount":2500,"currency":"EUR","created_at":"2026-12-02T13:35:02.656619Z","status":"pending"}`))
	})
	c := newTestClient(t, f.URL, WithToken("t"))
	rec, err := c.GetTransfer(context.Background(), "ab12")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != "ab12" || string(rec.Extra["status"]) != `"pending"` || !rec.CreatedAt.Equal(time.Date(2026, 12, 2, 13, 35, 2, 656619000, time.UTC)) {
		t.Errorf("record %+v", rec)
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[1].key != "" || reqs[1].auth != "Bearer t" {
		t.Errorf("requests %+v: want a retried GET without key, with the token", reqs)
	}
	_, err = c.GetTransfer(context.Background(), "../accounts/1/balance")
	var prob *Problem
	if !errors.As(err, &prob) || prob.Status != http.StatusNotFound {
		t.Errorf("error %v, want the 404 problem", err)
	}
	if got := f.requests()[2].path; got != "/transfers/..%2Faccounts%2F1%2Fbalance" {
		t.Errorf("id sent as %s: it must stay one path segment", got)
	}
	if _, err := c.GetTransfer(context.Background(), ""); err == nil {
		t.Error("an empty id was accepted")
	}
}

func TestGetTransferCredit(t *testing.T) {
	const transfer = `{"id":"ab12","src":8842,"dst":1190,"amount":2500,"currency":"EUR","created_at":"2026-12-02T13:35:02.656619Z"`
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			w.Write([]byte(transfer + `,"credit":{"state":"pending"}}`))
			return
		}
		w.Write([]byte(transfer + `,"credit":{"state":"settled","settled_at":"2026-12-02T13:35:02.912044Z"}}`))
	})
	c := newTestClient(t, f.URL)
	rec, err := c.GetTransfer(context.Background(), "ab12")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Credit == nil || rec.Credit.State != CreditPending || !rec.Credit.SettledAt.IsZero() || rec.Extra != nil {
		t.Errorf("pending: credit %+v, extra %v", rec.Credit, rec.Extra)
	}
	rec, err = c.GetTransfer(context.Background(), "ab12")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Credit == nil || rec.Credit.State != CreditSettled || !rec.Credit.SettledAt.Equal(time.Date(2026, 12, 2, 13, 35, 2, 912044000, time.UTC)) {
		t.Errorf("settled: credit %+v", rec.Credit)
	}
}

func TestBalance(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			problemAnswer(w, http.StatusServiceUnavailable, "shard-map-changing", "")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"account":-42,"balances":[
			{"currency":"CHF","balance":300,"credits":300,"debits":0,"pending_out":0},
			{"currency":"EUR","balance":-500,"credits":200,"debits":700,"pending_out":500,"reserved":0}],"as_of":"later"}`))
	})
	c := newTestClient(t, f.URL, WithToken("t"))
	b, err := c.Balance(context.Background(), -42)
	if err != nil {
		t.Fatal(err)
	}
	want := CurrencyBalance{Currency: "EUR", Balance: -500, Credits: 200, Debits: 700, PendingOut: 500}
	if eur, ok := b.In("EUR"); b.Account != -42 || len(b.Balances) != 2 || !ok || eur != want {
		t.Errorf("balance %+v", b)
	}
	if usd, ok := b.In("USD"); ok || usd != (CurrencyBalance{Currency: "USD"}) {
		t.Errorf("In(USD) = %+v, %t; want a zero position and false", usd, ok)
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[1].method != http.MethodGet || reqs[1].path != "/accounts/-42/balance" || reqs[1].key != "" || reqs[1].auth != "Bearer t" {
		t.Errorf("requests %+v: want a retried GET /accounts/-42/balance without key, with the token", reqs)
	}
}

func TestBalanceOfAnAccountWithoutRows(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"account":-9223372036854775808,"balances":[]}`))
	})
	b, err := newTestClient(t, f.URL).Balance(context.Background(), math.MinInt64)
	if err != nil {
		t.Fatal(err)
	}
	if b.Account != math.MinInt64 || b.Balances == nil || len(b.Balances) != 0 {
		t.Errorf("balance %+v", b)
	}
	if got := f.requests()[0].path; got != "/accounts/-9223372036854775808/balance" {
		t.Errorf("path %s", got)
	}
}

// TestBalanceErrors: refusals are problems, answered once; an answer that does not decode is
// an error that says so.
func TestBalanceErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		status int    // of the *Problem, 0 for none
		want   string // in the error
	}{
		{"unauthorized", func(w http.ResponseWriter) { problemAnswer(w, http.StatusUnauthorized, "unauthorized", "") }, 401, "unauthorized"},
		{"invalid account", func(w http.ResponseWriter) { problemAnswer(w, http.StatusBadRequest, "invalid-account", "") }, 400, "invalid-account"},
		{"internal error", func(w http.ResponseWriter) { problemAnswer(w, http.StatusInternalServerError, "internal-error", "") }, 500, "internal-error"},
		{"not json", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"account":1,"balances":{}}`))
		}, 0, "decoding the answer to GET /accounts/1/balance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) { tc.answer(w) })
			_, err := newTestClient(t, f.URL).Balance(context.Background(), 1)
			var prob *Problem
			switch {
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			case tc.status != 0 && (!errors.As(err, &prob) || prob.Status != tc.status):
				t.Errorf("error %v, want a *Problem with status %d", err, tc.status)
			case tc.status == 0 && errors.As(err, &prob):
				t.Errorf("error %v is a *Problem", err)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d requests; a final answer is not retried", n)
			}
		})
	}
}

// TestBalanceGivesUp: a shard that stays unavailable ends the call with the last problem and
// why retrying stopped.
func TestBalanceGivesUp(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		problemAnswer(w, http.StatusServiceUnavailable, "shard-unavailable", "")
	})
	p := testPolicy()
	p.MaxAttempts = 3
	c, err := New(f.URL, WithRetryPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Balance(context.Background(), 7)
	var prob *Problem
	if !errors.As(err, &prob) || prob.Slug() != "shard-unavailable" || !errors.Is(err, ErrAttemptsExhausted) {
		t.Errorf("error %v, want the 503 problem and ErrAttemptsExhausted", err)
	}
	if n := len(f.requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

func TestProbes(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/healthz":
			w.Write([]byte(`{"status":"ok"}`))
		case r.URL.Query().Get("partial") == "1":
			w.Write([]byte(`{"shardmap_version":3,"shards":{"shard-0":"ok","shard-1":"unreachable"}}`))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"shardmap_version":3,"shards":{"shard-0":"ok","shard-1":"unreachable"}}`))
		}
	})
	c := newTestClient(t, f.URL)
	if err := c.Healthz(context.Background()); err != nil {
		t.Error(err)
	}
	full, err := c.Readyz(context.Background(), false)
	if err != nil || full.Ready || full.ShardMapVersion != 3 || full.Shards["shard-1"] != "unreachable" {
		t.Errorf("readyz: %+v, %v", full, err)
	}
	partial, err := c.Readyz(context.Background(), true)
	if err != nil || !partial.Ready {
		t.Errorf("readyz?partial=1: %+v, %v", partial, err)
	}
	if n := len(f.requests()); n != 3 {
		t.Errorf("%d requests; probes must not retry", n)
	}
}
