-- 0001: the ledger, idempotency records and shard ownership.
--
-- A transfer is a function, so that a new transfer costs one round trip: claim, effect and
-- stored response run inside one statement's implicit transaction, so they commit together or
-- not at all. Functions live in idem/sql/, one file each, and migrate applies them after the
-- versioned migrations; this file keeps the tables.

CREATE TABLE ledger_entries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- transfer_id is derived from (scope, key) by the router, so a second application of the same
    -- idempotency key collides here forever, even after its idempotency record has expired.
    transfer_id     text        NOT NULL,
    -- keyspace id of account_id (sign bit flipped, see shardgate_owned_range): what a key-range
    -- move selects rows by.
    keyspace_id     bigint      NOT NULL,
    account_id      bigint      NOT NULL,
    counterparty_id bigint      NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    kind            text        NOT NULL CHECK (kind IN ('transfer_out', 'transfer_in')),
    reference       text,
    client          text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_entries_transfer_kind_key UNIQUE (transfer_id, kind)
);
CREATE INDEX ledger_entries_account_created_idx ON ledger_entries (account_id, created_at);

-- PostgreSQL rejects PRIMARY KEY (scope, key) here: a unique constraint on a partitioned table
-- must include the partition key. Uniqueness of (scope, key) across partitions is therefore
-- enforced by the transfer functions (advisory locks that serialize attempts of one key, then a
-- lookup across every partition), and within a partition by the unique index that
-- idem.EnsurePartitions gives each partition.
CREATE TABLE idempotency_record (
    key          text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    scope        text        NOT NULL,
    request_hash text        NOT NULL,
    keyspace_id  bigint      NOT NULL, -- of the source account; moves with its key range
    response     jsonb,
    state        text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (state = 'in_progress' OR response IS NOT NULL)
) PARTITION BY RANGE (created_at);

-- Which key ranges this shard owns, and from which shard map version. A transfer is applied only
-- for a keyspace id inside an owned range, so a router with a stale map cannot apply a key on a
-- shard that no longer owns it. Bounds are keyspace ids (unsigned 64-bit) stored with the sign bit
-- flipped, which keeps their order in a signed bigint; hi NULL means "to the end".
-- applying_version is the newest map version whose apply has begun here (its revoke ran):
-- no phase of an older map's apply is accepted after it, so two applies cannot interleave.
CREATE TABLE shardgate_shard (
    singleton        boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_name       text        NOT NULL,
    map_version      bigint      NOT NULL CHECK (map_version >= 0),
    applying_version bigint      NOT NULL DEFAULT 0,
    applying_digest  text        NOT NULL DEFAULT '', -- of that map's shards and ranges (idem.MapDigest)
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- active = false marks a range whose rows here belong to another shard (idem.ApplyMap):
-- revoked from this shard and not yet copied to its new owner (moving), or, with copied, rows
-- copied here for a range this shard has not been granted yet. Transfers only ever use active
-- ranges; settling an apply deletes the rows of inactive ranges not also covered by active ones.
-- A copied range is not held: only the shard it was copied from answers for its rows.
CREATE TABLE shardgate_owned_range (
    key_range text    PRIMARY KEY,
    lo        bigint  NOT NULL,
    hi        bigint,
    active    boolean NOT NULL DEFAULT true,
    copied    boolean NOT NULL DEFAULT false,
    CHECK (NOT (active AND copied)),
    CHECK (hi IS NULL OR lo < hi)
);
