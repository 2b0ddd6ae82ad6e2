package client

import (
	"context"
	"errors"
	"net/http"
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
