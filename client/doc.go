// Package client is a Go client for shardgate's HTTP API that makes the safe way to move money
// the easy one.
//
// # The key belongs to the operation, not to the attempt
//
// An Idempotency-Key names one business operation. It is minted once, when the caller decides
// to make the transfer ([NewTransfer] or [NewKey]), stored durably together with the transfer
// before the first attempt, and sent unchanged on every attempt of that operation — including
// attempts made after the caller's process crashed and restarted. This package never mints a
// key by itself: [Client.Send] refuses a [Transfer] without one, and its retries reuse the
// transfer's key and the exact same body bytes. A key minted inside a retry loop protects
// nothing.
//
//	t := client.NewTransfer(8842, 1190, 2500, "EUR") // mints the key once
//	saveDurably(t)                                   // key and body, before any network call
//	rcpt, err := c.Send(ctx, t)                      // retries reuse t.Key
//
// # Retries
//
// Send retries what the server or the network says may succeed later with the same key:
// connection errors and timeouts, 409 (the first attempt is still running), 429, 502, 503 and
// 504. It waits at least as long as Retry-After asks (seconds or an HTTP date), otherwise an
// exponential backoff with full jitter, capped by [RetryPolicy.MaxDelay]. After a network
// error it drops idle connections so the next attempt dials a fresh one. It never retries
// 400, 401, 404, 413, 415, 422 or 500: the server has decided, and asking again changes
// nothing.
//
// Retrying stops at the first of: the call's deadline (the context's, or
// [RetryPolicy.CallTimeout]), [RetryPolicy.MaxAttempts], or the client's retry budget, a
// token bucket shared by every call of one [Client]: each call earns [RetryPolicy.BudgetRatio]
// tokens, the bucket also earns [RetryPolicy.BudgetPerSecond] tokens a second (the floor that
// lets a quiet client retry), it holds at most [RetryPolicy.BudgetBurst] tokens and each retry
// costs one. With the defaults, beyond an initial burst of 10, retries are at most 10% of calls
// plus one a second, so an outage of the router does not turn every client into a retry storm.
//
// # Outcomes
//
// A transfer that was applied — now or by an earlier attempt whose answer was lost — returns a
// [Receipt]; Receipt.Replayed says the answer is the stored one. When retrying stops without an
// answer, Send returns an [*UnknownOutcomeError]: the transfer may or may not have been
// applied, and the only safe next step is to keep the key and send the same transfer again
// later. [ErrKeyReused] (the key belongs to a different request: a bug in the caller) and
// [ErrKeyExpired] (the key is older than the server's retention: it is never executed again;
// reconcile by other means) match with errors.Is; every answer of the server that is an error
// is a [*Problem] (RFC 9457) for errors.As.
//
// # Reads: where the money is
//
// A transfer is two legs: the debit of Src, applied by Send, and the credit of Dst, which the
// server delivers to the shard that owns Dst afterwards — at once when both accounts live on one
// shard, normally within a second otherwise, and only once that shard is reachable when it is
// down. [Client.GetTransfer] reports the credit's state ([CreditPending], then [CreditSettled]);
// the receipt of Send does not. [Client.Balance] reads an account's balance per currency from
// its own shard: money it sent whose credit is still on its way is in PendingOut, and money on
// its way to it is not in its balance until delivered. Reads are retried like transfers.
//
// The HTTP API is described by api/openapi.yaml, which this package follows.
package client
