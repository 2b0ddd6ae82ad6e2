// Package idem is shardgate's storage on each shard: the schema and its migrations, the
// one-round-trip transfer that claims an Idempotency-Key, writes the ledger entry and stores the
// response in one transaction, partition upkeep for idempotency records, and the key ranges a
// shard owns.
//
// Everything here runs against real PostgreSQL; the package holds no state of its own beyond
// the pools it is handed.
package idem
