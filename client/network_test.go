package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// hangUp closes the request's connection without answering, as a crashed router or a broken
// proxy would.
func hangUp(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	conn.Close()
}

func TestSendRetriesAfterConnectionDrop(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			hangUp(t, w)
			return
		}
		createdAnswer(w, false)
	})
	tr := testTransfer()
	rc, err := newTestClient(t, f.URL).Send(context.Background(), tr)
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 2 || rc.Attempts != 2 || reqs[1].key != reqs[0].key || string(reqs[1].body) != string(reqs[0].body) {
		t.Errorf("attempts %+v; want the dropped one and one retry with the same key and body", reqs)
	}
}

func TestSendWithoutAnyAnswerIsUnknownOutcome(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) { hangUp(t, w) })
	p := testPolicy()
	p.MaxAttempts = 2
	c, err := New(f.URL, WithRetryPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Send(context.Background(), testTransfer())
	var unknown *UnknownOutcomeError
	var prob *Problem
	if !errors.As(err, &unknown) || errors.As(err, &prob) || unknown.Last == nil {
		t.Errorf("error %v; want an unknown outcome whose last failure is the network error", err)
	}
}

// TestSendRetriesOnAFreshConnection checks that after an attempt got no answer, the retry dials
// a new connection instead of reusing another pooled one, which may be just as dead.
func TestSendRetriesOnAFreshConnection(t *testing.T) {
	warm := make(chan struct{})
	var warming atomic.Int32
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
			// Hold both warm-up requests until both are in, so they take two connections.
			if warming.Add(1) == 2 {
				close(warm)
			}
			select {
			case <-warm:
			case <-time.After(5 * time.Second):
			}
			w.Write([]byte(`{"status":"ok"}`))
		case n == 3: // the transfer's first attempt: no answer until the client gives up
			<-r.Context().Done()
		default:
			createdAnswer(w, false)
		}
	})
	var dials atomic.Int32
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport}
	// The warm-ups go through a client with the usual test policy, so that a slow machine does
	// not time them out; only the transfer's hung first attempt is meant to time out.
	warmer := newTestClient(t, f.URL, WithHTTPClient(hc))
	p := testPolicy()
	p.AttemptTimeout = time.Second
	c, err := New(f.URL, WithRetryPolicy(p), WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- warmer.Healthz(context.Background()) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if d := dials.Load(); d != 2 {
		t.Fatalf("warm-up dialed %d connections, want 2 idle ones", d)
	}

	if _, err := c.Send(context.Background(), testTransfer()); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 2 warm-ups and 2 attempts", len(reqs))
	}
	if d := dials.Load(); d != 3 {
		t.Errorf("%d dials in all; the retry should have dialed a third connection", d)
	}
	if retry := reqs[3].remote; retry == reqs[0].remote || retry == reqs[1].remote {
		t.Errorf("the retry reused pooled connection %s", retry)
	}
}
