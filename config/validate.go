package config

import (
	"fmt"
	"regexp"
	"time"
)

// currency is the form of an ISO 4217 currency code.
var currency = regexp.MustCompile(`^[A-Z]{3}$`)

// validate reports every setting outside what is safe to run.
func (c *Config) validate() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if c.Listen == "" {
		bad("listen: must be host:port, e.g. 127.0.0.1:8080")
	}
	if c.ShardmapPath == "" {
		bad("shardmap: must name the shard map file")
	}
	problems = append(problems, c.Idempotency.validate()...)
	switch c.Auth.Mode {
	case "none":
	case "tokens":
		if len(c.Auth.Clients) == 0 {
			bad("auth.clients: mode tokens needs at least one client (name, token_sha256)")
		}
	default:
		bad("auth.mode: %q must be tokens or none", c.Auth.Mode)
	}
	if !currency.MatchString(c.Transfers.DefaultCurrency) {
		bad("transfers.default_currency: %q must be an ISO 4217 code such as EUR", c.Transfers.DefaultCurrency)
	}
	if c.Transfers.MaxBodyBytes < 256 || c.Transfers.MaxBodyBytes > 1<<20 {
		bad("transfers.max_body_bytes: %d must be between 256 and 1048576", c.Transfers.MaxBodyBytes)
	}
	problems = append(problems, c.ShardPool.validate()...)
	if rc := c.ReplayCache; rc.MaxEntries < 0 || rc.MaxEntries > 10_000_000 {
		bad("replay_cache.max_entries: %d must be between 0 (off) and 10000000", rc.MaxEntries)
	} else if rc.MaxEntries > 0 && (rc.TTL <= 0 || rc.TTL >= c.Idempotency.ReplayWindow) {
		bad("replay_cache.ttl: %s must be positive and below idempotency.replay_window (%s), so that no cached replay outlives retention", rc.TTL, c.Idempotency.ReplayWindow)
	}
	problems = append(problems, c.GroupCommit.validate(c.ShardPool)...)
	problems = append(problems, c.Relay.validate(c.ShardPool.RequestTimeout)...)
	return append(problems, c.validateListeners()...)
}

func (r Relay) validate(requestTimeout time.Duration) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if r.PollInterval < 10*time.Millisecond || r.PollInterval > time.Hour {
		bad("relay.poll_interval: %s must be between 10ms and 1h", r.PollInterval)
	}
	if r.Batch < 1 || r.Batch > 10000 {
		bad("relay.batch: %d must be between 1 and 10000", r.Batch)
	}
	if r.Lease < 3*requestTimeout {
		bad("relay.lease: %s must be at least three times shard_pool.request_timeout (%s): a lease that runs out mid-delivery lets another relay deliver the same credit (it replays, but the work is wasted)", r.Lease, requestTimeout)
	}
	if r.BackoffBase <= 0 || r.BackoffMax < r.BackoffBase {
		bad("relay.backoff_base: %s must be positive and relay.backoff_max (%s) at least as long", r.BackoffBase, r.BackoffMax)
	}
	if r.KeepSettled < 0 {
		bad("relay.keep_settled: %s must not be negative", r.KeepSettled)
	}
	return problems
}

func (idm Idempotency) validate() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if idm.ReplayWindow <= 0 {
		bad("idempotency.replay_window: must be positive: the longest time after which any client or queue may still retry")
	}
	if idm.Retention < 2*idm.ReplayWindow {
		bad("idempotency.retention: %s is less than twice replay_window (%s): a late retry could find its key expired and apply the transfer again; set retention to at least %s",
			idm.Retention, idm.ReplayWindow, 2*idm.ReplayWindow)
	}
	if idm.PartitionsAhead < 1 || idm.PartitionsAhead > 366 {
		bad("idempotency.partitions_ahead: %d must be between 1 and 366", idm.PartitionsAhead)
	}
	if idm.InProgressRetryAfter < time.Second {
		bad("idempotency.in_progress_retry_after: %s is below 1s, the smallest Retry-After HTTP can express", idm.InProgressRetryAfter)
	}
	return problems
}

func (sp ShardPool) validate() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if sp.MaxConns < 1 || sp.MaxConns > 1000 {
		bad("shard_pool.max_conns: %d must be between 1 and 1000", sp.MaxConns)
	}
	if sp.ConnectTimeout <= 0 || sp.RequestTimeout <= 0 {
		bad("shard_pool: connect_timeout and request_timeout must be positive")
	}
	if sp.RetryAfter < time.Second {
		bad("shard_pool.retry_after: %s is below 1s, the smallest Retry-After HTTP can express", sp.RetryAfter)
	}
	if sp.MaxWaiting < 0 || sp.MaxWaiting > 100000 {
		bad("shard_pool.max_waiting: %d must be between 0 and 100000", sp.MaxWaiting)
	}
	return problems
}

// validate reports what is wrong with gc, given the shard pool its groups take connections from.
func (gc GroupCommit) validate(sp ShardPool) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if gc.MaxBatch < 1 || gc.MaxBatch > 1000 {
		bad("group_commit.max_batch: %d must be between 1 (group commit off: every transfer alone) and 1000", gc.MaxBatch)
	}
	if gc.InFlight < 1 || gc.InFlight > 1000 {
		bad("group_commit.in_flight: %d must be between 1 and 1000", gc.InFlight)
	} else if gc.MaxInFlight < gc.InFlight || gc.MaxInFlight > 1000 {
		bad("group_commit.max_in_flight: %d must be between group_commit.in_flight (%d) and 1000", gc.MaxInFlight, gc.InFlight)
	}
	if gc.StallAfter <= 0 || gc.StallAfter >= sp.RequestTimeout {
		bad("group_commit.stall_after: %s must be positive and below shard_pool.request_timeout (%s)", gc.StallAfter, sp.RequestTimeout)
	}
	return problems
}

// validateListeners checks the HTTP limits, TLS files and the admin listener.
func (c *Config) validateListeners() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	h := c.HTTP
	if h.ReadHeaderTimeout <= 0 || h.ReadTimeout <= 0 || h.WriteTimeout <= 0 || h.IdleTimeout <= 0 {
		bad("http: read_header_timeout, read_timeout, write_timeout and idle_timeout must be positive")
	}
	if h.WriteTimeout <= c.ShardPool.RequestTimeout {
		bad("http.write_timeout: %s must exceed shard_pool.request_timeout (%s), or a slow shard's answer could never be written", h.WriteTimeout, c.ShardPool.RequestTimeout)
	}
	if h.MaxHeaderBytes < 1024 || h.MaxHeaderBytes > 1<<20 {
		bad("http.max_header_bytes: %d must be between 1024 and 1048576", h.MaxHeaderBytes)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls: cert_file and key_file go together")
	}
	if c.TLS.ClientCAFile != "" && c.TLS.CertFile == "" {
		bad("tls.client_ca_file: mutual TLS needs cert_file and key_file too")
	}
	if c.Admin.Listen != "" && c.Admin.Listen == c.Listen {
		bad("admin.listen: must differ from listen (%s)", c.Listen)
	}
	return problems
}
