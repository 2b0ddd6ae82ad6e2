-- 0004: the credit leg. A transfer is two ledger rows: the debit (transfer_out) on the shard that
-- owns src and the credit (transfer_in) on the shard that owns dst. Both carry the transfer's id,
-- and the ledger's UNIQUE (transfer_id, kind) admits one credit per transfer, forever.
--
-- When the debit applies, the same transaction either writes the credit too (this shard owns dst
-- now) or records that the credit is owed: a row of shardgate_credit_outbox. The relay in every
-- router delivers owed credits to dst's shard through shardgate_apply_batch, the same claim path
-- as a debit (scope 'shardgate:credit', key = the transfer id), and only then marks the row
-- settled. A delivery that committed but was never acknowledged is delivered again and replays.
--
-- shardgate_apply_batch (set-wise) and shardgate_apply_rows (item by item, cheaper for small
-- groups) are now the bodies of a transfer attempt, debit or credit, with one contract; the
-- functions of 0001-0003 become wrappers over them, so routers of the previous release keep
-- working during a rolling upgrade and their debits record owed credits too.

-- A credit owed by a debit of this shard. keyspace_id is the source account's, so the row moves
-- with the source's key range. settled_at is the credit's own created_at on dst's shard, set once
-- it is known to be there; delivered rows are deleted by upkeep after relay.keep_settled.
CREATE TABLE shardgate_credit_outbox (
    transfer_id     text        PRIMARY KEY,
    keyspace_id     bigint      NOT NULL,
    src             bigint      NOT NULL,
    dst             bigint      NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    reference       text,
    client          text        NOT NULL,
    debited_at      timestamptz NOT NULL,
    settled_at      timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_until     timestamptz,
    last_error      text
);
-- What the relay scans: pending rows by when they are due.
CREATE INDEX shardgate_credit_outbox_due_idx ON shardgate_credit_outbox (next_attempt_at) WHERE settled_at IS NULL;
CREATE INDEX shardgate_credit_outbox_settled_idx ON shardgate_credit_outbox (settled_at) WHERE settled_at IS NOT NULL;
-- Balances read an account's ledger rows; the pending figure reads its owed credits.
CREATE INDEX shardgate_credit_outbox_src_idx ON shardgate_credit_outbox (src) WHERE settled_at IS NULL;

-- Debits written before this migration never had a credit: they are owed now, and the relay
-- delivers them like any other.
INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
SELECT d.transfer_id, d.keyspace_id, d.account_id, d.counterparty_id, d.amount, d.currency, d.reference, d.client, d.created_at
  FROM ledger_entries d
 WHERE d.kind = 'transfer_out'
   AND NOT EXISTS (SELECT 1 FROM ledger_entries c WHERE c.transfer_id = d.transfer_id AND c.kind = 'transfer_in');

-- A router of the previous release may be mid-statement while this migration runs: a debit its
-- old function body writes and commits after the backfill above never gets an owed row (the
-- body it runs is the one it compiled, whatever this migration replaces). Upkeep therefore
-- sweeps once, when the grace after this migration has passed, every debit of the hour before
-- it and later that has neither its credit here nor an owed row (idem.SweepUpgradeWindow).
CREATE TABLE shardgate_credit_sweep (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    since     timestamptz NOT NULL,
    done_at   timestamptz
);
INSERT INTO shardgate_credit_sweep (since) VALUES (now());

-- shardgate_apply_batch runs a group of transfer attempts, each one leg (p_kinds: transfer_out
-- or transfer_in) of one transfer, in one statement and one transaction. Per item, with
-- p_keyspaces the keyspace id of the leg's own account (src for a debit, dst for a credit):
--   not_owner    this shard does not own p_keyspaces[i]; shard_map_version says which map it follows
--   key_reused   (scope, key) belongs to another request hash, stored or in flight
--   in_progress  the same request is in flight (another transaction, or earlier in this group)
--   replayed     a completed record with the same hash exists; stored_response is its response
--   expired      the leg is in the ledger, older than p_retention, and its record is gone
--   record_missing  the leg is in the ledger, younger than p_retention, and its record is gone
--   applied      the leg, its completed record, and for a debit its credit or owed credit
--                were written. credit_settled says which: true when this shard owns
--                p_counter_keyspaces[i] (dst's keyspace id; NULL never) and wrote the credit in
--                this transaction, false when it recorded the credit as owed.
--
-- Concurrency is as in 0001: a try-lock on (scope, key, request hash), then on (scope, key);
-- try-locks never wait, and a lookup across every partition follows, in a later statement, so
-- that its snapshot sees whatever committed before the locks were taken. Two attempts of one
-- key in one group are answered as two concurrent attempts are: the later one is in flight
-- (in_progress, or key_reused for another request) behind an earlier one that applied, whose
-- claim is not committed; otherwise it gets what a lone attempt gets. An error in any item fails
-- the whole statement, which then commits nothing.
--
-- The group is worked set-wise, a statement per step for all its items rather than a statement
-- per item and step: PostgreSQL sets up the executor, its expressions and the tables' constraint
-- and default expressions once per statement, which costs more than the row itself. Later
-- attempts of a key are rare; they are answered afterwards, as a group of their own.
CREATE FUNCTION shardgate_apply_batch(
    p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[],
    p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[],
    p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
LANGUAGE plpgsql
-- No lock wait inside a transfer is legitimate for long (an ownership change, a DBA's LOCK
-- TABLE): give up and let the client retry rather than strand the backend.
SET lock_timeout = '10s'
AS $fn$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    map_version bigint;
    decided text[];        -- per item: its outcome so far; NULL while it may still apply
    stored jsonb[];        -- per item: the response a replay returns
    settled boolean[];     -- per applied debit: its credit written here (true) or owed (false)
    applied integer[];     -- the items whose leg was inserted
    later integer[];       -- items that attempt a key an earlier owned item of the group attempts
    rest integer[];        -- of those, the ones whose earlier attempt did not apply
    i integer;
    verdict text;
    r record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF (SELECT count(*) FROM unnest(ARRAY[
            array_length(p_kinds, 1), array_length(p_scopes, 1), array_length(p_request_hashes, 1),
            array_length(p_keyspaces, 1), array_length(p_transfer_ids, 1), array_length(p_clients, 1),
            array_length(p_accounts, 1), array_length(p_counterparties, 1), array_length(p_counter_keyspaces, 1),
            array_length(p_amounts, 1), array_length(p_currencies, 1), array_length(p_references, 1),
            array_length(p_responses, 1)]) l WHERE l IS DISTINCT FROM n) > 0 THEN
        RAISE EXCEPTION 'shardgate_apply_batch: the item arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) k WHERE k IS NULL OR k NOT IN ('transfer_out', 'transfer_in')) THEN
        RAISE EXCEPTION 'shardgate_apply_batch: every kind must be transfer_out or transfer_in' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it. Once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    SELECT s.map_version INTO map_version FROM shardgate_shard s;

    -- 1. Ownership; later attempts of a key set aside; the try-locks of the others. A CASE
    --    evaluates its conditions in order, so the key lock is tried only by the holder of its
    --    request lock.
    SELECT array_agg(o.early ORDER BY o.i), coalesce(array_agg(o.i ORDER BY o.i) FILTER (WHERE o.early = 'later'), '{}')
      INTO decided, later
      FROM (SELECT w.i, CASE
                   WHEN NOT w.owned THEN 'not_owner'
                   WHEN w.first < w.i THEN 'later'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident || E'\n' || w.request_hash, 2)) THEN 'in_progress'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident, 1)) THEN 'key_reused'
                   END AS early
              FROM (SELECT v.*, min(v.i) FILTER (WHERE v.owned) OVER (PARTITION BY v.ident) AS first
                      FROM (SELECT t.i::integer AS i, t.s || E'\n' || t.k AS ident, t.h AS request_hash,
                                   EXISTS (SELECT 1 FROM shardgate_owned_range o
                                            WHERE o.active AND o.lo <= t.ks AND (o.hi IS NULL OR t.ks < o.hi)) AS owned
                              FROM unnest(p_scopes, p_keys, p_request_hashes, p_keyspaces) WITH ORDINALITY AS t(s, k, h, ks, i)) v) w) o;

    -- 2. A fresh snapshot, after the locks: each key's record, in whatever partition. A record
    --    decides; without one, a lock held elsewhere does.
    SELECT array_agg(CASE
               WHEN t.early IN ('not_owner', 'later') OR rec.request_hash IS NULL THEN t.early
               WHEN rec.request_hash <> t.h THEN 'key_reused'
               WHEN rec.state = 'completed' THEN 'replayed'
               ELSE 'in_progress' END ORDER BY t.i),
           array_agg(CASE WHEN rec.request_hash = t.h AND rec.state = 'completed' THEN rec.response END ORDER BY t.i)
      INTO decided, stored
      FROM unnest(p_scopes, p_keys, p_request_hashes, decided) WITH ORDINALITY AS t(s, k, h, early, i)
      LEFT JOIN LATERAL (SELECT ir.request_hash, ir.state, ir.response FROM idempotency_record ir
                          WHERE ir.scope = t.s AND ir.key = t.k AND t.early IS DISTINCT FROM 'not_owner'
                            AND t.early IS DISTINCT FROM 'later'
                          LIMIT 1) rec ON true;

    -- 3. The legs of the items still undecided. The ledger's unique (transfer_id, kind) refuses a
    --    leg it holds already, record or no record.
    WITH ins AS (
        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        SELECT t.tid, t.ks, t.acct, t.cp, t.amount, t.cur, t.kind, t.ref, t.client
          FROM unnest(p_transfer_ids, p_keyspaces, p_accounts, p_counterparties, p_amounts, p_currencies, p_kinds, p_references, p_clients, decided)
               AS t(tid, ks, acct, cp, amount, cur, kind, ref, client, d)
         WHERE t.d IS NULL
        ON CONFLICT (transfer_id, kind) DO NOTHING
        RETURNING transfer_id, kind)
    -- An inserted leg is the first undecided item's of its (transfer_id, kind); any other item
    -- under the same transfer id finds it in the ledger, as it would row by row.
    SELECT coalesce(array_agg(f.i), '{}') INTO applied
      FROM (SELECT DISTINCT ON (t.tid, t.kind) t.i::integer AS i
              FROM unnest(p_transfer_ids, p_kinds, decided) WITH ORDINALITY AS t(tid, kind, d, i)
              JOIN ins ON ins.transfer_id = t.tid AND ins.kind = t.kind
             WHERE t.d IS NULL
             ORDER BY t.tid, t.kind, t.i) f;

    -- 4. A leg the ledger held: expired only when older than retention (as in 0002), else its
    --    record is missing.
    SELECT array_agg(CASE
               WHEN t.d IS NOT NULL THEN t.d
               WHEN t.i = ANY (applied) THEN 'applied'
               WHEN EXISTS (SELECT 1 FROM ledger_entries l
                             WHERE l.transfer_id = t.tid AND l.kind = t.kind
                               AND l.created_at < statement_timestamp() - p_retention) THEN 'expired'
               ELSE 'record_missing' END ORDER BY t.i),
           array_agg(CASE WHEN t.i = ANY (applied) AND t.kind = 'transfer_out' THEN
                         t.cks IS NOT NULL AND EXISTS (SELECT 1 FROM shardgate_owned_range o
                                                        WHERE o.active AND o.lo <= t.cks AND (o.hi IS NULL OR t.cks < o.hi))
                     END ORDER BY t.i)
      INTO decided, settled
      FROM unnest(p_transfer_ids, p_kinds, p_counter_keyspaces, decided) WITH ORDINALITY AS t(tid, kind, cks, d, i);

    -- 5. Their completed records. Raises 23514 when upkeep has not created the partition for
    --    now(); the whole statement, and so the group, then rolls back.
    INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
    SELECT t.k, t.s, t.h, t.ks, t.resp, 'completed'
      FROM unnest(p_keys, p_scopes, p_request_hashes, p_keyspaces, p_responses) WITH ORDINALITY AS t(k, s, h, ks, resp, i)
     WHERE t.i = ANY (applied);

    -- 6. Each applied debit's credit: here, fenced by the same lock, when this shard owns dst;
    --    else owed.
    INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
    SELECT t.tid, t.cks, t.cp, t.acct, t.amount, t.cur, 'transfer_in', t.ref, t.client
      FROM unnest(p_transfer_ids, p_counter_keyspaces, p_accounts, p_counterparties, p_amounts, p_currencies, p_references, p_clients)
           WITH ORDINALITY AS t(tid, cks, acct, cp, amount, cur, ref, client, i)
     WHERE settled[t.i]
    ON CONFLICT (transfer_id, kind) DO NOTHING;
    INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
    SELECT t.tid, t.ks, t.acct, t.cp, t.amount, t.cur, t.ref, t.client, now()
      FROM unnest(p_transfer_ids, p_keyspaces, p_accounts, p_counterparties, p_amounts, p_currencies, p_references, p_clients)
           WITH ORDINALITY AS t(tid, ks, acct, cp, amount, cur, ref, client, i)
     WHERE NOT settled[t.i];

    -- 7. Later attempts of a key: in flight behind an earlier attempt that applied; otherwise
    --    answered as a group of their own (after the ones before them, so in the same order).
    IF cardinality(later) > 0 THEN
        rest := '{}';
        FOREACH i IN ARRAY later LOOP
            verdict := NULL;
            SELECT CASE WHEN p_request_hashes[j] = p_request_hashes[i] THEN 'in_progress' ELSE 'key_reused' END
              INTO verdict
              FROM generate_series(1, i - 1) j
             WHERE decided[j] = 'applied' AND p_scopes[j] = p_scopes[i] AND p_keys[j] = p_keys[i];
            decided[i] := verdict;
            IF verdict IS NULL THEN
                rest := rest || i;
            END IF;
        END LOOP;
        IF cardinality(rest) > 0 THEN
            FOR r IN SELECT b.* FROM shardgate_apply_batch(
                    (SELECT array_agg(p_kinds[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_scopes[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_keys[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_request_hashes[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_keyspaces[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_transfer_ids[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_clients[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_accounts[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_counterparties[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_counter_keyspaces[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_amounts[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_currencies[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_references[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    (SELECT array_agg(p_responses[j] ORDER BY o) FROM unnest(rest) WITH ORDINALITY u(j, o)),
                    p_retention) b LOOP
                decided[rest[r.idx]] := r.outcome;
                stored[rest[r.idx]] := r.stored_response;
                settled[rest[r.idx]] := r.credit_settled;
            END LOOP;
        END IF;
    END IF;

    RETURN QUERY
    SELECT g.i, decided[g.i], stored[g.i], CASE WHEN decided[g.i] = 'not_owner' THEN map_version END, settled[g.i]
      FROM generate_series(1, n) AS g(i);
END
$fn$;

-- shardgate_apply_rows is shardgate_apply_batch item by item: a few statements per item
-- instead of a few per group. For a small group that is cheaper (the set-wise statements cost
-- more to set up than a handful of rows costs); from about eight items the set-wise function
-- wins (idem.setWiseFrom chooses). The contract, outcomes and locking are the same; the idem
-- tests run the same cases through both.
CREATE FUNCTION shardgate_apply_rows(
    p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[],
    p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[],
    p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
LANGUAGE plpgsql
-- No lock wait inside a transfer is legitimate for long (an ownership change, a DBA's LOCK
-- TABLE): give up and let the client retry rather than strand the backend.
SET lock_timeout = '10s'
AS $fn$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    claimed text[] := '{}';   -- scope || E'\n' || key of the items this call claimed
    claimed_hash text[] := '{}';
    map_version bigint;
    ident text;
    pos integer;
    if_absent text;
    prior record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF (SELECT count(*) FROM unnest(ARRAY[
            array_length(p_kinds, 1), array_length(p_scopes, 1), array_length(p_request_hashes, 1),
            array_length(p_keyspaces, 1), array_length(p_transfer_ids, 1), array_length(p_clients, 1),
            array_length(p_accounts, 1), array_length(p_counterparties, 1), array_length(p_counter_keyspaces, 1),
            array_length(p_amounts, 1), array_length(p_currencies, 1), array_length(p_references, 1),
            array_length(p_responses, 1)]) l WHERE l IS DISTINCT FROM n) > 0 THEN
        RAISE EXCEPTION 'shardgate_apply_rows: the item arrays differ in length' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it. Once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    SELECT s.map_version INTO map_version FROM shardgate_shard s;

    FOR i IN 1 .. n LOOP
        idx := i;
        outcome := NULL;
        stored_response := NULL;
        shard_map_version := NULL;
        credit_settled := NULL;
        IF p_kinds[i] IS NULL OR p_kinds[i] NOT IN ('transfer_out', 'transfer_in') THEN
            RAISE EXCEPTION 'shardgate_apply_rows: item % has kind %, not transfer_out or transfer_in', i, p_kinds[i] USING ERRCODE = '22023';
        END IF;
        ident := p_scopes[i] || E'\n' || p_keys[i];

        IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range
                        WHERE active AND lo <= p_keyspaces[i] AND (hi IS NULL OR p_keyspaces[i] < hi)) THEN
            outcome := 'not_owner';
            shard_map_version := map_version;
            RETURN NEXT;
            CONTINUE;
        END IF;

        pos := array_position(claimed, ident);
        IF pos IS NOT NULL THEN
            -- Claimed by an earlier item of this group, not committed yet: in flight.
            outcome := CASE WHEN claimed_hash[pos] = p_request_hashes[i] THEN 'in_progress' ELSE 'key_reused' END;
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- What a record-less key is when its locks are held elsewhere: the same request in flight
        -- (its hash lock is taken) or another request holding the key.
        if_absent := NULL;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(ident || E'\n' || p_request_hashes[i], 2)) THEN
            if_absent := 'in_progress';
        ELSIF NOT pg_try_advisory_xact_lock(hashtextextended(ident, 1)) THEN
            if_absent := 'key_reused';
        END IF;
        SELECT ir.request_hash, ir.state, ir.response INTO prior
          FROM idempotency_record ir WHERE ir.scope = p_scopes[i] AND ir.key = p_keys[i];
        IF FOUND THEN
            IF prior.request_hash <> p_request_hashes[i] THEN
                outcome := 'key_reused';
            ELSIF prior.state = 'completed' THEN
                outcome := 'replayed';
                stored_response := prior.response;
            ELSE
                outcome := 'in_progress';
            END IF;
            RETURN NEXT;
            CONTINUE;
        ELSIF if_absent IS NOT NULL THEN
            outcome := if_absent;
            RETURN NEXT;
            CONTINUE;
        END IF;

        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        VALUES (p_transfer_ids[i], p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i], p_currencies[i], p_kinds[i], p_references[i], p_clients[i])
        ON CONFLICT (transfer_id, kind) DO NOTHING;
        IF NOT FOUND THEN
            -- As in 0002: expired only for a leg older than retention.
            IF EXISTS (SELECT 1 FROM ledger_entries
                        WHERE transfer_id = p_transfer_ids[i] AND kind = p_kinds[i]
                          AND created_at < statement_timestamp() - p_retention) THEN
                outcome := 'expired';
            ELSE
                outcome := 'record_missing';
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Raises 23514 when upkeep has not created the partition for now(); the whole statement
        -- then rolls back.
        INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
        VALUES (p_keys[i], p_scopes[i], p_request_hashes[i], p_keyspaces[i], p_responses[i], 'completed');

        IF p_kinds[i] = 'transfer_out' THEN
            credit_settled := p_counter_keyspaces[i] IS NOT NULL AND EXISTS (
                SELECT 1 FROM shardgate_owned_range
                 WHERE active AND lo <= p_counter_keyspaces[i] AND (hi IS NULL OR p_counter_keyspaces[i] < hi));
            IF credit_settled THEN
                -- dst lives here: the credit commits with the debit, fenced by the same lock.
                INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
                VALUES (p_transfer_ids[i], p_counter_keyspaces[i], p_counterparties[i], p_accounts[i], p_amounts[i], p_currencies[i], 'transfer_in', p_references[i], p_clients[i])
                ON CONFLICT (transfer_id, kind) DO NOTHING;
            ELSE
                INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
                VALUES (p_transfer_ids[i], p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i], p_currencies[i], p_references[i], p_clients[i], now());
            END IF;
        END IF;
        claimed := claimed || ident;
        claimed_hash := claimed_hash || p_request_hashes[i];
        outcome := 'applied';
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- The transfer functions of earlier releases, as wrappers: one body, and a debit through any of
-- them records its owed credit.
CREATE OR REPLACE FUNCTION shardgate_transfer_batch(
    p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_srcs bigint[], p_dsts bigint[], p_amounts bigint[],
    p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT b.idx, b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_batch(
           array_fill('transfer_out'::text, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_scopes, p_keys, p_request_hashes, p_keyspaces, p_transfer_ids, p_clients, p_srcs, p_dsts,
           array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_amounts, p_currencies, p_references, p_responses, p_retention) b
$fn$;

CREATE OR REPLACE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb, p_retention interval,
    OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_rows(ARRAY['transfer_out'], ARRAY[p_scope], ARRAY[p_key], ARRAY[p_request_hash],
           ARRAY[p_keyspace], ARRAY[p_transfer_id], ARRAY[p_client], ARRAY[p_src], ARRAY[p_dst], ARRAY[NULL::bigint],
           ARRAY[p_amount], ARRAY[p_currency], ARRAY[p_reference], ARRAY[p_response], p_retention) b
$fn$;

-- 0001's function answered "expired" for any debit without its record: a retention of zero.
CREATE OR REPLACE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb,
    OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT t.outcome, t.stored_response, t.shard_map_version
      FROM shardgate_transfer(p_scope, p_key, p_request_hash, p_keyspace, p_transfer_id, p_client,
           p_src, p_dst, p_amount, p_currency, p_reference, p_response, interval '0') t
$fn$;
