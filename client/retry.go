package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RetryPolicy bounds how a [Client] retries. Start from [DefaultRetryPolicy] and change what
// you need; [New] refuses a policy with a field out of range.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included; 1 disables retries.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: before retry n the client waits a random time
	// in [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)) ("full jitter"), or at least what Retry-After asks.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// AttemptTimeout bounds one attempt, from sending the request to reading the whole answer.
	// It should exceed the router's shard request timeout (5s by default), so that a slow
	// transfer is answered rather than abandoned and retried.
	AttemptTimeout time.Duration
	// CallTimeout is the overall deadline of a call whose context has none.
	CallTimeout time.Duration
	// The retry budget, a token bucket shared by every call of one Client: each call earns
	// BudgetRatio tokens, the bucket earns BudgetPerSecond tokens a second, holds at most
	// BudgetBurst tokens (it starts full) and each retry costs one token. Retries are thus at
	// most BudgetRatio of calls plus BudgetPerSecond a second, beyond the first BudgetBurst.
	BudgetRatio     float64
	BudgetPerSecond float64
	BudgetBurst     float64
}

// DefaultRetryPolicy returns the defaults: 8 attempts, backoff from 100ms capped at 5s, 10s
// per attempt, 60s per call without a context deadline, and a budget of 10% of calls plus one
// retry a second with a burst of 10.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		MaxAttempts:     8,
		BaseDelay:       100 * time.Millisecond,
		MaxDelay:        5 * time.Second,
		AttemptTimeout:  10 * time.Second,
		CallTimeout:     60 * time.Second,
		BudgetRatio:     0.1,
		BudgetPerSecond: 1,
		BudgetBurst:     10,
	}
}

// validate lists every field out of range.
func (p RetryPolicy) validate() error {
	var errs []error
	bad := func(field, rule string) { errs = append(errs, fmt.Errorf("RetryPolicy.%s must be %s", field, rule)) }
	if p.MaxAttempts < 1 {
		bad("MaxAttempts", "at least 1")
	}
	if p.BaseDelay <= 0 || p.MaxDelay < p.BaseDelay {
		bad("BaseDelay and MaxDelay", "positive, with MaxDelay >= BaseDelay")
	}
	if p.AttemptTimeout <= 0 || p.CallTimeout <= 0 {
		bad("AttemptTimeout and CallTimeout", "positive")
	}
	if p.BudgetRatio < 0 || p.BudgetPerSecond < 0 || p.BudgetBurst < 0 {
		bad("BudgetRatio, BudgetPerSecond and BudgetBurst", "zero or positive")
	}
	return errors.Join(errs...)
}

// backoff is the full-jitter wait before retry n (n >= 1).
func (p RetryPolicy) backoff(n int) time.Duration {
	ceiling := p.BaseDelay
	for i := 1; i < n && ceiling < p.MaxDelay; i++ {
		ceiling *= 2
	}
	return rand.N(min(ceiling, p.MaxDelay))
}

// wait is how long to wait before retry n after err: the backoff, but at least what the
// server's Retry-After asked plus up to a tenth more, so that clients told the same
// Retry-After do not all come back at the same instant.
func (p RetryPolicy) wait(n int, err error) time.Duration {
	d := p.backoff(n)
	var prob *Problem
	if errors.As(err, &prob) && prob.RetryAfter > 0 {
		d = max(d, prob.RetryAfter+rand.N(prob.RetryAfter/10+1))
	}
	return d
}

// budget is the retry budget described in RetryPolicy.
type budget struct {
	mu                      sync.Mutex
	tokens, last            float64 // last: when tokens were last refilled, in seconds since start
	ratio, perSecond, burst float64
	start                   time.Time
}

func newBudget(p RetryPolicy) *budget {
	return &budget{tokens: p.BudgetBurst, ratio: p.BudgetRatio, perSecond: p.BudgetPerSecond, burst: p.BudgetBurst, start: time.Now()}
}

// refill adds the tokens earned by time and n calls since the last refill; b.mu is held.
func (b *budget) refill(calls int) {
	now := time.Since(b.start).Seconds()
	b.tokens = min(b.burst, b.tokens+(now-b.last)*b.perSecond+float64(calls)*b.ratio)
	b.last = now
}

// earn credits one call.
func (b *budget) earn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(1)
}

// spend takes the token one retry costs, if there is one.
func (b *budget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(0)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// retryable reports whether an attempt that failed with err may succeed later with the same
// key: any failure to get an answer (network error, attempt timeout), and the statuses that say
// "not now": 409 (the first attempt is in flight), 429, 502, 503, 504.
func retryable(err error) bool {
	var prob *Problem
	if !errors.As(err, &prob) {
		return true
	}
	switch prob.Status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
// A date in the past is a wait of 0.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// sleep waits d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
