package config

import (
	"fmt"
	"time"
)

// Buffering holds, in the router, the requests for a key range whose owner refuses them while
// the range moves between shards, and sends them on once the range's new owner takes them, so
// that a move shows as latency rather than as errors. A request is held at most MaxWait (and
// never past shard_pool.request_timeout, which counts from its arrival), and at most
// MaxRequests are held at once across every moving range; past either bound the request is
// answered 503 shard-map-changing with Retry-After. Either set to 0 turns buffering off.
type Buffering struct {
	MaxWait     time.Duration
	MaxRequests int
}

// Enabled reports whether moving ranges' requests are held rather than answered 503 at once.
func (b Buffering) Enabled() bool { return b.MaxWait > 0 && b.MaxRequests > 0 }

// bufferingFile is the buffering section as router.yaml spells it.
type bufferingFile struct {
	MaxWait     *duration `yaml:"max_wait"`
	MaxRequests *int      `yaml:"max_requests"`
}

// withDefaults fills what the section leaves out, given shard_pool.request_timeout. max_wait: a
// move's fence (revoke, last catch-up, grant) is meant to last about a second, and a router
// holding an older map needs one more reload to find the new owner; 3s covers both with room to
// spare and leaves 2s of the default request_timeout for the transfer itself once sent on (with
// a request_timeout of 3s or less, half of it, so that such a configuration stays valid).
// max_requests: 1000 held requests cost about a goroutine and a body each (at most
// transfers.max_body_bytes), some megabytes, while at the rates one router serves they cover a
// fence of a second or more.
func (f bufferingFile) withDefaults(requestTimeout time.Duration) Buffering {
	wait := 3 * time.Second
	if requestTimeout <= wait {
		wait = requestTimeout / 2
	}
	return Buffering{MaxWait: durOr(f.MaxWait, wait), MaxRequests: deref(f.MaxRequests, 1000)}
}

// validate reports what is wrong with b, given the deadline of one request.
func (b Buffering) validate(sp ShardPool) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if b.MaxWait < 0 || b.MaxWait > 0 && sp.RequestTimeout > 0 && b.MaxWait >= sp.RequestTimeout {
		bad("buffering.max_wait: %s must be between 0 (off) and below shard_pool.request_timeout (%s), which bounds the whole request: a held request needs time left to run on its new owner", b.MaxWait, sp.RequestTimeout)
	}
	if b.MaxRequests < 0 || b.MaxRequests > 100000 {
		bad("buffering.max_requests: %d must be between 0 (off) and 100000", b.MaxRequests)
	}
	return problems
}
