// Package shardmap parses, validates and queries the shard map file,
// shardmap.yaml, which assigns every keyspace id to exactly one shard.
//
// A transfer is routed by its source account: [KeyspaceID] hashes the
// account to a 64-bit keyspace id, and [Map.ShardFor] finds the shard whose
// Vitess-style [KeyRange] contains that id. [Parse] is the only way to build a
// [Map]; it either returns a map whose ranges cover the keyspace exactly once
// or a [*ValidationError] listing every problem with its line, so an invalid
// map can never be applied. [Compare] reports what a new map changes before it
// is applied.
//
// The package is pure logic: it never connects to a database.
package shardmap
