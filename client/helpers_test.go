package client

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// seen is one request as the fake router received it.
type seen struct {
	method, path, key, auth string
	body                    []byte
	remote                  string
	at                      time.Time
}

// fakeRouter is an httptest server that answers the n-th request (from 1) with answer and
// records every request it received.
type fakeRouter struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

func newFakeRouter(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *fakeRouter {
	t.Helper()
	f := &fakeRouter{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, seen{method: r.Method, path: r.URL.RequestURI(), key: r.Header.Get("Idempotency-Key"),
			auth: r.Header.Get("Authorization"), body: body, remote: r.RemoteAddr, at: time.Now()})
		n := len(f.reqs)
		f.mu.Unlock()
		answer(n, w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// requests returns what the fake router received so far.
func (f *fakeRouter) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

// testPolicy retries fast and has budget to spare, so tests measure behaviour, not waits.
func testPolicy() RetryPolicy {
	p := DefaultRetryPolicy()
	p.BaseDelay, p.MaxDelay = time.Millisecond, 5*time.Millisecond
	p.AttemptTimeout, p.CallTimeout = 2*time.Second, 10*time.Second
	p.BudgetBurst = 100
	return p
}

func newTestClient(t *testing.T, url string, opts ...Option) *Client {
	t.Helper()
	c, err := New(url, append([]Option{WithRetryPolicy(testPolicy())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// problemAnswer answers like the router's writeProblem.
func problemAnswer(w http.ResponseWriter, status int, slug, retryAfter string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"%s%s","title":"title of %s","status":%d,"detail":"detail of %s"}`+"\n", ProblemBase, slug, slug, status, slug)
}

// createdAnswer answers like the router's stored 201 for a transfer of 2500 from 8842 to 1190.
func createdAnswer(w http.ResponseWriter, replayed bool) {
	const id = "1d65d16c18855fc71604d62cd89294d7da18490cdc8316fa"
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/transfers/"+id)
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"%s","src":8842,"dst":1190,"amount":2500,"currency":"EUR"}`+"\n", id)
}

func testTransfer() Transfer { return NewTransfer(8842, 1190, 2500, "EUR") }
