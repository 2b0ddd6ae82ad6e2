package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// maxResponseBytes bounds an answer's body; every answer of the API is far smaller.
const maxResponseBytes = 1 << 20

// Client talks to one shardgate router. It is safe for concurrent use; its retry budget is
// shared by all its calls, so use one Client per router and process.
type Client struct {
	base   string
	token  string
	hc     *http.Client
	policy RetryPolicy
	budget *budget
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends Authorization: Bearer token on every request. The token names the client,
// and the client's name is part of every key's scope on the server: keep using the same token
// (or another token of the same configured client) for every attempt of an operation.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient makes the Client use hc (for TLS settings, proxies or instrumentation)
// instead of a client of its own. Its Timeout, if any, bounds each attempt too. After an
// attempt that got no answer the Client closes hc's idle connections, so give it a transport
// of its own rather than http.DefaultClient.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetryPolicy replaces [DefaultRetryPolicy].
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.policy = p } }

// New returns a Client for the router at baseURL, e.g. "https://shardgate.internal:8080".
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("shardgate: base URL %q must be an absolute http or https URL such as http://127.0.0.1:8080", baseURL)
	}
	c := &Client{base: strings.TrimSuffix(baseURL, "/"), policy: DefaultRetryPolicy()}
	for _, o := range opts {
		o(c)
	}
	if err := c.policy.validate(); err != nil {
		return nil, fmt.Errorf("shardgate: %w", err)
	}
	if c.hc == nil {
		// A transport of its own: dropping its idle connections after a network error
		// (see Client.retryAfter) touches no one else's.
		c.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c.budget = newBudget(c.policy)
	return c, nil
}

// call is one API request, sent identically on every attempt.
type call struct {
	method, path string
	body         []byte
	key          string // the Idempotency-Key, for a transfer
	answers      []int  // the statuses that answer the call; others are errors
	once         bool   // no retries: a probe reports what it sees
}

// reply is an answer with its body read.
type reply struct {
	status int
	header http.Header
	body   []byte
	tries  int
}

// do sends cl until it is answered with one of cl.answers, a final error, or retrying stops.
func (c *Client) do(ctx context.Context, cl call) (*reply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // nothing was sent
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.policy.CallTimeout)
		defer cancel()
	}
	c.budget.earn()
	for n := 1; ; n++ {
		rep, err := c.attempt(ctx, cl)
		if err == nil && slices.Contains(cl.answers, rep.status) {
			rep.tries = n
			return rep, nil
		}
		if err == nil {
			err = problemFrom(rep.status, rep.header, rep.body)
		}
		if cl.once || !retryable(err) {
			return nil, err
		}
		if stop := c.retryAfter(ctx, n, err); stop != nil {
			return nil, c.gaveUp(cl, n, err, stop)
		}
	}
}

// retryAfter waits before retry n+1 after err, or says why there is none.
func (c *Client) retryAfter(ctx context.Context, n int, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if n >= c.policy.MaxAttempts {
		return ErrAttemptsExhausted
	}
	wait := c.policy.wait(n, err)
	if dl, _ := ctx.Deadline(); time.Until(dl) < wait {
		return fmt.Errorf("waiting %s to retry would pass the call's deadline: %w", wait.Round(time.Millisecond), context.DeadlineExceeded)
	}
	if !c.budget.spend() {
		return ErrRetryBudgetExhausted
	}
	var prob *Problem
	if !errors.As(err, &prob) {
		// No answer: the connection, a proxy or the router behind it may be broken. Pooled
		// connections to the same address may be just as dead (a restarted router, a failed-over
		// load balancer), so the retry dials a fresh one.
		c.hc.CloseIdleConnections()
	}
	return sleep(ctx, wait)
}

// gaveUp is the error of a call whose retries stopped without a final answer.
func (c *Client) gaveUp(cl call, attempts int, last, stopped error) error {
	if cl.key != "" {
		return &UnknownOutcomeError{Key: cl.key, Attempts: attempts, Last: last, Stopped: stopped}
	}
	return fmt.Errorf("shardgate: %s %s: no answer after %d attempt(s) (stopped: %w; last: %w)", cl.method, cl.path, attempts, stopped, last)
}

// attempt sends cl once and reads the whole answer within the policy's AttemptTimeout.
func (c *Client) attempt(ctx context.Context, cl call) (*reply, error) {
	ctx, cancel := context.WithTimeout(ctx, c.policy.AttemptTimeout)
	defer cancel()
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, c.base+cl.path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", "shardgate-go-client")
	if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.key != "" {
		req.Header.Set("Idempotency-Key", keyHeader(cl.key))
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer to %s %s: %w", cl.method, cl.path, err)
	}
	if len(b) > maxResponseBytes {
		return nil, fmt.Errorf("the answer to %s %s is larger than %d bytes", cl.method, cl.path, maxResponseBytes)
	}
	return &reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}
