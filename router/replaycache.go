package router

import (
	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
)

// replayCache holds responses that shards answered as completed (applied, or replayed), by
// scope and key, so that a retry of a completed key with the same request is replayed without
// a round trip to its shard. It is sound because a completed record never changes: what the
// shard stored is what the cache holds. A replay is served from it only for the same scope
// (so the same client) and the same request hash; any other request goes to the shard, which
// decides. Entries live at most replay_cache.ttl, which config keeps below replay_window, so a
// cached replay cannot outlive retention for a retry the router accepts. What it costs: memory
// (max_entries × (key + response), about 1 KB each), and a replay may be served for a record a
// DBA deleted by hand within the last TTL.
//
// On a shard with synchronous standbys an answer is remembered only once it is known to be on
// them (see transferAt), so a failover to a synchronous standby leaves every entry true. A shard
// whose identity changes (a failover to an asynchronous standby, a restore) may have lost what
// its entries say is done: they are dropped (dropShard) when the router first connects to the
// new database, and when a reload gives the shard a new DSN.
type replayCache struct {
	lru *expirable.LRU[cacheKey, cachedReplay]
}

// cacheKey is a record's scope and key. A struct, not one joined string, so that neither a
// lookup nor an insert builds a string.
type cacheKey struct{ scope, key string }

type cachedReplay struct {
	shard       string // that answered it
	requestHash string
	response    idem.Response
}

// newReplayCache returns nil when the cache is off.
func newReplayCache(c config.ReplayCache) *replayCache {
	if c.MaxEntries == 0 {
		return nil
	}
	return &replayCache{lru: expirable.NewLRU[cacheKey, cachedReplay](c.MaxEntries, nil, c.TTL)}
}

// get returns the stored response of (scope, key) if the shard answered it as completed for
// this very request.
func (c *replayCache) get(scope, key, requestHash string) (idem.Response, bool) {
	if c == nil {
		return idem.Response{}, false
	}
	e, ok := c.lru.Get(cacheKey{scope, key})
	if !ok || e.requestHash != requestHash {
		return idem.Response{}, false
	}
	return e.response, true
}

// remember records shard's answer if it says the key is completed.
func (c *replayCache) remember(shard string, req idem.TransferRequest, res idem.TransferResult) {
	if c == nil || (res.Outcome != idem.Applied && res.Outcome != idem.Replayed) {
		return
	}
	c.lru.Add(cacheKey{req.Scope, req.Key}, cachedReplay{shard: shard, requestHash: req.RequestHash, response: res.Response})
}

// dropShard forgets every answer of shard and returns how many there were.
func (c *replayCache) dropShard(shard string) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, k := range c.lru.Keys() {
		if e, ok := c.lru.Peek(k); ok && e.shard == shard {
			c.lru.Remove(k)
			n++
		}
	}
	return n
}
