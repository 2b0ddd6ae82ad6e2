package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"
)

// ProblemBase prefixes every problem type URI the API answers with; what follows it is the
// problem's slug (see api/openapi.yaml for the full list).
const ProblemBase = "https://shardgate.dev/problems/"

// The problem types this package gives sentinels for.
const (
	TypeKeyReused  = ProblemBase + "idempotency-key-reused"
	TypeKeyExpired = ProblemBase + "idempotency-key-expired"
)

var (
	// ErrKeyReused matches (errors.Is) a 422 idempotency-key-reused: the key was first used for
	// a different request. It is a bug in the caller — a key minted per session or per user
	// instead of per operation, or an operation edited after its key was stored. Nothing was
	// applied for this request; do not retry it with this key.
	ErrKeyReused = errors.New("shardgate: the Idempotency-Key was used for a different request")

	// ErrKeyExpired matches (errors.Is) a 422 idempotency-key-expired: the key is older than
	// the server's retention. The server will not execute it; whether an earlier attempt was
	// applied cannot be told from this answer, so reconcile by other means (for example
	// GET /transfers/{id} with an id from an earlier answer) and never resend under a new key
	// without knowing.
	ErrKeyExpired = errors.New("shardgate: the Idempotency-Key is older than the server's retention")

	// ErrRetryBudgetExhausted is why retrying stopped when the client's retry budget was spent
	// (see [RetryPolicy]); it is wrapped by [*UnknownOutcomeError].
	ErrRetryBudgetExhausted = errors.New("the client's retry budget is spent")

	// ErrAttemptsExhausted is why retrying stopped after [RetryPolicy.MaxAttempts] attempts;
	// it is wrapped by [*UnknownOutcomeError].
	ErrAttemptsExhausted = errors.New("the call's attempts are used up")
)

// Problem is an error answer of the API: an RFC 9457 problem detail. Use errors.As to get it.
// A 500 (internal-error) is not retried by Send; the server did not apply the transfer as far
// as it knows, and sending the same transfer again later with the same key is safe.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is set only if the server sends one.
	Instance string `json:"instance,omitempty"`
	// RetryAfter is the wait the Retry-After header asked for, or 0 if there was none.
	RetryAfter time.Duration `json:"-"`
}

// Error describes the problem with its status, slug, title and detail.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "shardgate: %d %s: %s", p.Status, p.Slug(), p.Title)
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	return b.String()
}

// Slug is the problem type without [ProblemBase], e.g. "shard-unavailable".
func (p *Problem) Slug() string { return strings.TrimPrefix(p.Type, ProblemBase) }

// Is makes errors.Is(err, ErrKeyReused) and errors.Is(err, ErrKeyExpired) match the problems
// of those types.
func (p *Problem) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return p.Type == TypeKeyReused
	case ErrKeyExpired:
		return p.Type == TypeKeyExpired
	}
	return false
}

// maxSnippet bounds how much of a body that is not a problem document goes into an error.
const maxSnippet = 200

// problemFrom turns an error answer into a *Problem. A body that is not a problem document
// (a proxy's HTML page, the router's plain-text 404 for an unknown path) becomes a problem of
// type "about:blank" with the status text as title and the start of the body as detail.
func problemFrom(status int, header http.Header, body []byte) *Problem {
	p := &Problem{}
	mt, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if mt != "application/problem+json" || json.Unmarshal(body, p) != nil || p.Type == "" {
		detail := strings.TrimSpace(string(body))
		if len(detail) > maxSnippet {
			detail = detail[:maxSnippet] + "…"
		}
		p = &Problem{Type: "about:blank", Title: http.StatusText(status), Detail: detail}
	}
	p.Status = status // the status line is authoritative (RFC 9457 §3.1.2)
	p.RetryAfter, _ = parseRetryAfter(header.Get("Retry-After"), time.Now())
	return p
}

// UnknownOutcomeError is returned by [Client.Send] when retrying stopped — deadline, attempts
// or retry budget spent — before the server gave a final answer. The transfer may have been
// applied or not. Keep the transfer and its key, and send the same transfer again later: the
// server applies it at most once and answers a retry of an applied transfer with its stored
// response. Never resend it under a new key.
type UnknownOutcomeError struct {
	// Key is the transfer's Idempotency-Key, to keep.
	Key string
	// Attempts is how many attempts were made.
	Attempts int
	// Last is the last attempt's failure: a *Problem (409, 503, …) or a network error.
	Last error
	// Stopped is why retrying stopped: ErrRetryBudgetExhausted, ErrAttemptsExhausted, or an
	// error matching context.DeadlineExceeded or context.Canceled.
	Stopped error
}

// Error says that the outcome is unknown and what to do about it.
func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("shardgate: transfer with Idempotency-Key %q: outcome unknown after %d attempt(s) (stopped: %v; last: %v); keep the key and send the same transfer again later — never under a new key",
		e.Key, e.Attempts, e.Stopped, e.Last)
}

// Unwrap returns the last failure and the reason retrying stopped, for errors.Is and errors.As.
func (e *UnknownOutcomeError) Unwrap() []error { return []error{e.Last, e.Stopped} }
