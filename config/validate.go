package config

import (
	"fmt"
	"time"
)

// validate reports what is wrong with r, given the deadline of one request to a shard.
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
	if r.ReoweWindow < 0 {
		bad("relay.reowe_window: %s must not be negative", r.ReoweWindow)
	}
	return problems
}

// validate reports what is wrong with idm.
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

// validate reports what is wrong with sp.
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
