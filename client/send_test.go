package client

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestSendRetriesWithSameKeyAndBody(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			problemAnswer(w, http.StatusServiceUnavailable, "shard-unavailable", "")
		case 2:
			problemAnswer(w, http.StatusConflict, "request-in-progress", "")
		case 3:
			w.WriteHeader(http.StatusBadGateway) // a proxy's answer, not a problem document
		default:
			createdAnswer(w, true)
		}
	})
	c := newTestClient(t, f.URL, WithToken("token-a"))
	tr := testTransfer()
	tr.Reference = `invoice "42" \ march`
	rc, err := c.Send(context.Background(), tr)
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 4 || rc.Attempts != 4 {
		t.Fatalf("server saw %d attempts, receipt says %d; want 4", len(reqs), rc.Attempts)
	}
	wantKey := `"` + tr.Key + `"`
	for i, r := range reqs {
		if r.method != http.MethodPost || r.path != "/transfers" {
			t.Errorf("attempt %d: %s %s, want POST /transfers", i+1, r.method, r.path)
		}
		if r.key != wantKey {
			t.Errorf("attempt %d: Idempotency-Key %q, want %q", i+1, r.key, wantKey)
		}
		if !bytes.Equal(r.body, reqs[0].body) {
			t.Errorf("attempt %d: body %s differs from the first attempt's %s", i+1, r.body, reqs[0].body)
		}
		if r.auth != "Bearer token-a" {
			t.Errorf("attempt %d: Authorization %q", i+1, r.auth)
		}
	}
	const wantBody = `{"src":8842,"dst":1190,"amount":2500,"currency":"EUR","reference":"invoice \"42\" \\ march"}`
	if string(reqs[0].body) != wantBody {
		t.Errorf("body %s, want %s", reqs[0].body, wantBody)
	}
	if !rc.Replayed || rc.Status != http.StatusCreated || rc.Transfer.ID != "1d65d16c18855fc71604d62cd89294d7da18490cdc8316fa" {
		t.Errorf("receipt %+v", rc)
	}
}

func TestSendHonoursRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		status int
		slug   string
	}{
		{http.StatusConflict, "request-in-progress"},
		{http.StatusServiceUnavailable, "shard-busy"},
	} {
		t.Run(tc.slug, func(t *testing.T) {
			f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					problemAnswer(w, tc.status, tc.slug, "1")
					return
				}
				createdAnswer(w, false)
			})
			if _, err := newTestClient(t, f.URL).Send(context.Background(), testTransfer()); err != nil {
				t.Fatal(err)
			}
			reqs := f.requests()
			if len(reqs) != 2 {
				t.Fatalf("%d attempts, want 2", len(reqs))
			}
			// The backoff alone would wait at most 5ms (testPolicy).
			if gap := reqs[1].at.Sub(reqs[0].at); gap < time.Second {
				t.Errorf("retried after %s; Retry-After asked for 1s", gap)
			}
		})
	}
}

func TestSendDoesNotRetryFinalAnswers(t *testing.T) {
	for _, tc := range []struct {
		status int
		slug   string
		is     error // the sentinel the error must match, if any
	}{
		{http.StatusBadRequest, "invalid-request-body", nil},
		{http.StatusBadRequest, "invalid-idempotency-key", nil},
		{http.StatusUnauthorized, "unauthorized", nil},
		{http.StatusNotFound, "transfer-not-found", nil},
		{http.StatusRequestEntityTooLarge, "request-too-large", nil},
		{http.StatusUnsupportedMediaType, "unsupported-media-type", nil},
		{http.StatusUnprocessableEntity, "idempotency-key-reused", ErrKeyReused},
		{http.StatusUnprocessableEntity, "idempotency-key-expired", ErrKeyExpired},
		{http.StatusInternalServerError, "internal-error", nil},
	} {
		t.Run(tc.slug, func(t *testing.T) {
			f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
				problemAnswer(w, tc.status, tc.slug, "1")
			})
			_, err := newTestClient(t, f.URL).Send(context.Background(), testTransfer())
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
			var prob *Problem
			if !errors.As(err, &prob) {
				t.Fatalf("error %v (%T) is not a *Problem", err, err)
			}
			if prob.Status != tc.status || prob.Slug() != tc.slug || prob.Detail != "detail of "+tc.slug {
				t.Errorf("problem %+v", prob)
			}
			for _, sentinel := range []error{ErrKeyReused, ErrKeyExpired} {
				if got := errors.Is(err, sentinel); got != (sentinel == tc.is) {
					t.Errorf("errors.Is(err, %v) = %t", sentinel, got)
				}
			}
			var unknown *UnknownOutcomeError
			if errors.As(err, &unknown) {
				t.Errorf("a final answer is reported as an unknown outcome: %v", err)
			}
		})
	}
}

func TestSendStopsWhenRetryBudgetIsSpent(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		problemAnswer(w, http.StatusServiceUnavailable, "shard-unavailable", "")
	})
	p := testPolicy()
	p.BudgetBurst, p.BudgetRatio, p.BudgetPerSecond = 2, 0, 0
	c, err := New(f.URL, WithRetryPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	tr := testTransfer()
	_, err = c.Send(context.Background(), tr)
	var unknown *UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("error %v (%T), want *UnknownOutcomeError", err, err)
	}
	if unknown.Key != tr.Key || unknown.Attempts != 3 || len(f.requests()) != 3 {
		t.Errorf("key %q after %d attempts (server saw %d); want %q after 3", unknown.Key, unknown.Attempts, len(f.requests()), tr.Key)
	}
	if !errors.Is(err, ErrRetryBudgetExhausted) {
		t.Errorf("error %v does not say the budget is spent", err)
	}
	var prob *Problem
	if !errors.As(err, &prob) || prob.Slug() != "shard-unavailable" {
		t.Errorf("the last failure is not the 503 problem: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, tr.Key) || !strings.Contains(msg, "keep the key") {
		t.Errorf("message %q does not tell to keep the key", msg)
	}

	// The budget is the client's, not the call's: the next call gets no retry at all.
	_, err = c.Send(context.Background(), testTransfer())
	if !errors.As(err, &unknown) || unknown.Attempts != 1 || len(f.requests()) != 4 {
		t.Errorf("second call: %v after %d requests in all, want one attempt", err, len(f.requests()))
	}
}

func TestSendStopsAfterMaxAttempts(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		problemAnswer(w, http.StatusConflict, "request-in-progress", "")
	})
	p := testPolicy()
	p.MaxAttempts = 3
	c, err := New(f.URL, WithRetryPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Send(context.Background(), testTransfer())
	var unknown *UnknownOutcomeError
	if !errors.As(err, &unknown) || !errors.Is(err, ErrAttemptsExhausted) || len(f.requests()) != 3 {
		t.Errorf("error %v after %d attempts, want an unknown outcome after 3", err, len(f.requests()))
	}
}

func TestSendDoesNotWaitPastTheDeadline(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) {
		problemAnswer(w, http.StatusServiceUnavailable, "shard-map-changing", "30")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := newTestClient(t, f.URL).Send(ctx, testTransfer())
	var unknown *UnknownOutcomeError
	if !errors.As(err, &unknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want an unknown outcome stopped by the deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second || len(f.requests()) != 1 {
		t.Errorf("gave up after %s and %d attempts; a 30s Retry-After cannot fit in the deadline, so it should give up at once", took, len(f.requests()))
	}
}

func TestSendWithoutKeySendsNothing(t *testing.T) {
	f := newFakeRouter(t, func(n int, w http.ResponseWriter, r *http.Request) { createdAnswer(w, false) })
	c := newTestClient(t, f.URL)
	tr := testTransfer()
	for _, key := range []string{"", "has space", strings.Repeat("k", 256), "ключ"} {
		tr.Key = key
		if _, err := c.Send(context.Background(), tr); err == nil {
			t.Errorf("key %q: sent", key)
		}
	}
	tr.Key = ""
	if _, err := c.Send(context.Background(), tr); !errors.Is(err, ErrNoKey) {
		t.Errorf("empty key: %v, want ErrNoKey", err)
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests reached the server", n)
	}
}
