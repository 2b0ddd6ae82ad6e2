package router

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// ProblemBase prefixes every problem type URI. The URIs are stable: clients branch on them.
const ProblemBase = "https://shardgate.dev/problems/"

// problemType is one kind of RFC 9457 problem: a stable type URI, its status and title.
type problemType struct {
	slug   string
	status int
	title  string
}

// Each client-visible failure has its own type; no two cases share one.
var (
	probInvalidBody      = problemType{"invalid-request-body", http.StatusBadRequest, "The request body is not a valid transfer"}
	probMissingKey       = problemType{"missing-idempotency-key", http.StatusBadRequest, "The Idempotency-Key header is required"}
	probInvalidKey       = problemType{"invalid-idempotency-key", http.StatusBadRequest, "The Idempotency-Key header is not valid"}
	probInvalidID        = problemType{"invalid-transfer-id", http.StatusBadRequest, "The transfer id is not valid"}
	probInvalidAccount   = problemType{"invalid-account", http.StatusBadRequest, "The account parameter is not valid"}
	probUnauthorized     = problemType{"unauthorized", http.StatusUnauthorized, "Missing or invalid bearer token"}
	probNotFound         = problemType{"transfer-not-found", http.StatusNotFound, "No such transfer"}
	probTooLarge         = problemType{"request-too-large", http.StatusRequestEntityTooLarge, "The request body is too large"}
	probMediaType        = problemType{"unsupported-media-type", http.StatusUnsupportedMediaType, "The request body must be UTF-8 application/json"}
	probInProgress       = problemType{"request-in-progress", http.StatusConflict, "A request with this Idempotency-Key is still in progress"}
	probKeyReused        = problemType{"idempotency-key-reused", http.StatusUnprocessableEntity, "The Idempotency-Key was used for a different request"}
	probKeyExpired       = problemType{"idempotency-key-expired", http.StatusUnprocessableEntity, "The Idempotency-Key is older than the retention period"}
	probShardUnavailable = problemType{"shard-unavailable", http.StatusServiceUnavailable, "The shard that owns this account is unavailable"}
	probShardBusy        = problemType{"shard-busy", http.StatusServiceUnavailable, "The shard that owns this account is saturated"}
	probStorageNotReady  = problemType{"storage-not-ready", http.StatusServiceUnavailable, "The owning shard cannot store idempotency records right now"}
	probStaleMap         = problemType{"shard-map-changing", http.StatusServiceUnavailable, "The account's key range is moving between shards"}
	probRecordMissing    = problemType{"idempotency-record-missing", http.StatusServiceUnavailable, "The key's stored response is missing on its shard"}
	probInternal         = problemType{"internal-error", http.StatusInternalServerError, "Internal error"}
)

// problem is the RFC 9457 body.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers with pt; retryAfter > 0 adds a Retry-After header in whole seconds.
func writeProblem(w http.ResponseWriter, pt problemType, detail string, retryAfter time.Duration) {
	body := appendProblem(make([]byte, 0, 256), pt, detail)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(pt.status)
	w.Write(body) //nolint:errcheck // the client went away; nothing to do
}

// appendProblem appends the body of a problem of type pt: json.Marshal of its problem and a
// newline, built by hand because overload answers every request with one.
func appendProblem(b []byte, pt problemType, detail string) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, ProblemBase+pt.slug)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, pt.title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(pt.status), 10)
	if detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, detail)
	}
	return append(b, "}\n"...)
}

// maxQuoted is how many characters of client-supplied text a problem's detail repeats: enough to
// recognize it, not enough for a 15,000-character field name to make a 15 KB answer.
const maxQuoted = 64

// clip returns s whole if it has at most maxQuoted characters, else its first maxQuoted followed
// by "…" and its length in characters. Every detail that repeats client text passes it through
// clip, or through quote.
func clip(s string) string {
	head, n := clipHead(s)
	if len(head) == len(s) {
		return s
	}
	return fmt.Sprintf("%s… (%d characters)", head, n)
}

// quote is clip for text that is quoted, as %q does: the quoted part is the first maxQuoted
// characters, so escapes cannot hide where the cut is.
func quote(s string) string {
	head, n := clipHead(s)
	if len(head) == len(s) {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d characters)", strconv.Quote(head), n)
}

// clipHead returns the first maxQuoted characters of s and the number of characters in s.
func clipHead(s string) (string, int) {
	n := utf8.RuneCountInString(s)
	if n <= maxQuoted {
		return s, n
	}
	end := 0
	for range maxQuoted {
		_, size := utf8.DecodeRuneInString(s[end:])
		end += size
	}
	return s[:end], n
}
