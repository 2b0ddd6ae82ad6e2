-- 0001: the ledger, idempotency records, shard ownership and the one-round-trip transfer function.
--
-- Why the transfer is a function: a new transfer must cost one round trip. Claim, effect and
-- stored response run inside one statement's implicit transaction, so they commit together or
-- not at all, and the client's COMMIT is the end of that statement.

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
-- enforced by shardgate_transfer (advisory locks that serialize attempts of one key, then a
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

-- shardgate_prior_outcome classifies what an earlier attempt of (scope, key) left behind.
-- It returns if_absent when there is no record.
CREATE FUNCTION shardgate_prior_outcome(
    p_scope text, p_key text, p_request_hash text, p_if_absent text,
    OUT outcome text, OUT stored_response jsonb)
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
BEGIN
    SELECT ir.request_hash, ir.state, ir.response INTO r
      FROM idempotency_record ir
     WHERE ir.scope = p_scope AND ir.key = p_key;
    IF NOT FOUND THEN
        outcome := p_if_absent;
    ELSIF r.request_hash <> p_request_hash THEN
        outcome := 'key_reused';
    ELSIF r.state = 'completed' THEN
        outcome := 'replayed';
        stored_response := r.response;
    ELSE
        outcome := 'in_progress';
    END IF;
END
$fn$;

-- shardgate_transfer claims (scope, key), writes the debit and stores the response, or reports
-- why it did not. Outcomes:
--   applied      the debit and the completed record were written (in this statement's transaction)
--   replayed     a completed record with the same request hash exists; stored_response is it
--   key_reused   the key belongs to a different request (stored, or in flight right now)
--   in_progress  the same request is in flight in another transaction
--   expired      the transfer exists in the ledger but its idempotency record has been dropped
--   not_owner    this shard does not own p_keyspace; shard_map_version says which map it follows
--
-- Concurrency: every attempt first takes a try-lock on (scope, key, request_hash), then on
-- (scope, key). Try-locks never wait, so a duplicate is answered at once instead of queueing
-- behind the first attempt. Holding the (scope, key) lock serializes all attempts of a key on
-- this shard whatever partition their record would land in; the lookup after it sees every
-- committed record, because a VOLATILE PL/pgSQL function takes a fresh snapshot per statement.
-- Taking the request-hash lock first is what lets a concurrent attempt with a different body get
-- key_reused rather than in_progress: whoever holds the key lock also holds its own hash lock.
CREATE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb,
    OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint)
LANGUAGE plpgsql
-- No lock wait inside a transfer is legitimate for long (an ownership change, a DBA's LOCK
-- TABLE): give up and let the client retry rather than strand the backend after the router's
-- own deadline has passed.
SET lock_timeout = '10s'
AS $fn$
BEGIN
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range
                    WHERE active AND lo <= p_keyspace AND (hi IS NULL OR p_keyspace < hi)) THEN
        outcome := 'not_owner';
        SELECT s.map_version INTO shard_map_version FROM shardgate_shard s;
        RETURN;
    END IF;

    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key || E'\n' || p_request_hash, 2)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'in_progress') po;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key, 1)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'key_reused') po;
        RETURN;
    END IF;
    SELECT po.outcome, po.stored_response INTO outcome, stored_response
      FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, NULL) po;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;

    INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
    VALUES (p_transfer_id, p_keyspace, p_src, p_dst, p_amount, p_currency, 'transfer_out', p_reference, p_client)
    ON CONFLICT (transfer_id, kind) DO NOTHING;
    IF NOT FOUND THEN
        outcome := 'expired';
        RETURN;
    END IF;
    -- Raises 23514 (no partition of relation ... found for row) when upkeep has not created the
    -- partition for now(); the whole statement, debit included, then rolls back.
    INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
    VALUES (p_key, p_scope, p_request_hash, p_keyspace, p_response, 'completed');
    outcome := 'applied';
END
$fn$;

-- shardgate_copy_records inserts the idempotency records staged in the temporary table
-- moving_rows (idem.ApplyMap, moving a key range here) that this shard does not hold yet. Each
-- key is copied under the (scope, key) lock shardgate_transfer takes, and looked up afresh after
-- taking it, so a copy and a transfer of the same key can never both insert a record: the
-- transfer meanwhile gets in_progress, or the copy finds the transfer's record. It returns how
-- many it inserted, and how many keys this shard already held for a different request (a key
-- reused across shards: its record here wins and the moved one is not copied).
CREATE FUNCTION shardgate_copy_records(OUT inserted bigint, OUT conflicts bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    m record;
    held_hash text;
BEGIN
    inserted := 0;
    conflicts := 0;
    FOR m IN SELECT * FROM moving_rows ORDER BY scope, key LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(m.scope || E'\n' || m.key, 1));
        SELECT r.request_hash INTO held_hash
          FROM idempotency_record r WHERE r.scope = m.scope AND r.key = m.key LIMIT 1;
        IF NOT FOUND THEN
            INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
            VALUES (m.key, m.scope, m.request_hash, m.keyspace_id, m.response, m.state, m.created_at);
            inserted := inserted + 1;
        ELSIF held_hash IS DISTINCT FROM m.request_hash THEN
            conflicts := conflicts + 1;
        END IF;
    END LOOP;
END
$fn$;
