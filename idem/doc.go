// Package idem is what runs on one shard: the schema (versioned migrations, and one file per
// SQL function under sql/), the one-round-trip transfer that claims an Idempotency-Key, writes
// the ledger entry and stores the response in one transaction, the lookup of a transfer, the
// rows that say which key ranges the shard owns (and their phases during a move), and partition
// upkeep for idempotency records. Moving ranges between shards is package rangemove's job,
// built on these primitives.
//
// Everything here runs against real PostgreSQL through the pool it is handed; it opens no
// connections of its own. Its one piece of state is UpkeepCollector, which remembers each
// shard's last upkeep result to serve as metrics between passes.
package idem
