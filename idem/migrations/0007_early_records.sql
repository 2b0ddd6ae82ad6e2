-- 0007: the partitions a shard held when it was upgraded to 0006 leave every lookup within hours
-- instead of with retention. Same signatures, outcomes, locks and order of checks as 0006.
--
-- 0006 keeps every partition that begins before shardgate_record_floor.unchecked_before in every
-- key lookup, because records written before it were never held to the rule that no record is
-- dated before its key's floor: a client clock ahead of the shard's dated some early, by about the
-- clocks' difference. Upkeep now reads each such partition once, newest first, for how early its
-- records are dated (idem.bringUnderRule), and in one transaction raises early_by to that and
-- lowers unchecked_before past the partition. So a record dated before unchecked_before may
-- predate its key's floor by any time, and any other by at most early_by, and a lookup reads
-- records dated from the earliest floor of its group less early_by on, as well as those before
-- unchecked_before. Nothing is rewritten: a completed record never changes.
--
-- Adding the column takes shardgate_record_floor's ACCESS EXCLUSIVE lock for a moment; every
-- transfer reads that table, so this waits for those in flight, at most 10 s, then fails whole
-- (router migrate says so) and can simply be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE shardgate_record_floor
    ADD COLUMN early_by interval NOT NULL DEFAULT '0' CONSTRAINT early_by_not_negative CHECK (early_by >= '0');

CREATE OR REPLACE FUNCTION shardgate_apply_batch(
    p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[],
    p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[],
    p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
LANGUAGE plpgsql
SET lock_timeout = '10s'
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    map_version bigint;
    floors timestamptz[];     -- per item: its key's floor (NULL: none)
    lookup_floor timestamptz; -- the lookup reads records dated from here on (the earliest floor, less early_by) ...
    unchecked timestamptz;    -- ... and any dated before this (see shardgate_record_floor)
    decided text[];        -- per item: its outcome so far; NULL while it may still apply
    stored jsonb[];        -- per item: the response a replay returns
    settled boolean[];     -- per applied debit: its credit written here (true) or owed (false)
    unapplied bigint;      -- items that reached the ledger and found their leg there already
    later integer[];       -- items that attempt a key an earlier owned item of the group attempts
    rest integer[];        -- of those, the ones whose earlier attempt did not apply
    i integer;
    verdict text;
    r record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF shardgate_group_args_invalid(n, p_kinds, array_length(p_kinds, 1), array_length(p_scopes, 1),
            array_length(p_request_hashes, 1), array_length(p_keyspaces, 1), array_length(p_transfer_ids, 1),
            array_length(p_clients, 1), array_length(p_accounts, 1), array_length(p_counterparties, 1),
            array_length(p_counter_keyspaces, 1), array_length(p_amounts, 1), array_length(p_currencies, 1),
            array_length(p_references, 1), array_length(p_responses, 1)) THEN
        RAISE EXCEPTION 'shardgate_apply_batch: the item arrays differ in length, or a kind is not transfer_out or transfer_in' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it. Once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);

    -- 1. Ownership; later attempts of a key set aside; the try-locks of the others. A CASE
    --    evaluates its conditions in order, so the key lock is tried only by the holder of its
    --    request lock. And the bounds of step 2's lookup: the group's earliest key floor (none
    --    when a key has no floor), and the date before which records may predate the floor.
    SELECT array_agg(o.early ORDER BY o.i), coalesce(array_agg(o.i ORDER BY o.i) FILTER (WHERE o.early = 'later'), '{}'),
           array_agg(o.key_floor ORDER BY o.i),
           CASE WHEN bool_and(o.key_floor IS NOT NULL)
                THEN min(o.key_floor) - coalesce((SELECT f.early_by FROM shardgate_record_floor f), '0')
                ELSE '-infinity' END,
           coalesce((SELECT f.unchecked_before FROM shardgate_record_floor f), 'infinity')
      INTO decided, later, floors, lookup_floor, unchecked
      FROM (SELECT w.i, w.key_floor, CASE
                   WHEN NOT w.owned THEN 'not_owner'
                   WHEN w.first < w.i THEN 'later'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident || E'\n' || w.request_hash, 2)) THEN 'in_progress'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident, 1)) THEN 'key_reused'
                   END AS early
              FROM (SELECT v.*, min(v.i) FILTER (WHERE v.owned) OVER (PARTITION BY v.ident) AS first
                      FROM (SELECT t.i::integer AS i, t.s || E'\n' || t.k AS ident, t.h AS request_hash, shardgate_key_floor(t.k) AS key_floor,
                                   EXISTS (SELECT 1 FROM shardgate_owned_range o WHERE o.active AND o.lo <= t.ks AND (o.hi IS NULL OR t.ks < o.hi)) AS owned
                              FROM unnest(p_scopes, p_keys, p_request_hashes, p_keyspaces) WITH ORDINALITY AS t(s, k, h, ks, i)) v) w) o;

    -- 2. A fresh snapshot, after the locks: each key's record, in whatever partition it can be.
    --    The bounds are parameters known when the statement starts, so PostgreSQL leaves out
    --    (initial pruning) every partition that ends before lookup_floor and begins at or after
    --    unchecked. A record decides; without one, a lock held elsewhere does.
    SELECT array_agg(CASE
               WHEN t.early IN ('not_owner', 'later') OR rec.request_hash IS NULL THEN t.early
               WHEN rec.request_hash <> t.h THEN 'key_reused'
               WHEN rec.state = 'completed' THEN 'replayed'
               ELSE 'in_progress' END ORDER BY t.i),
           array_agg(CASE WHEN rec.request_hash = t.h AND rec.state = 'completed' THEN rec.response END ORDER BY t.i)
      INTO decided, stored
      FROM unnest(p_scopes, p_keys, p_request_hashes, decided) WITH ORDINALITY AS t(s, k, h, early, i)
      LEFT JOIN LATERAL (SELECT ir.request_hash, ir.state, ir.response FROM idempotency_record ir
                          WHERE ir.scope = t.s AND ir.key = t.k
                            AND (ir.created_at >= lookup_floor OR ir.created_at < unchecked)
                            AND t.early IS DISTINCT FROM 'not_owner'
                            AND t.early IS DISTINCT FROM 'later'
                          LIMIT 1) rec ON true;

    -- 3. One statement writes what the items still undecided apply: the leg (the ledger's unique
    --    (transfer_id, kind) refuses one it holds already, record or no record; an inserted leg
    --    is the first undecided item's of its (transfer_id, kind), and any other item under the
    --    same transfer id finds it in the ledger, as it would row by row), its completed record,
    --    dated no earlier than its key's floor (raising 23514 when upkeep has not created the
    --    partition for that date: the whole statement, and so the group, then rolls back), and a
    --    debit's credit: here, fenced by the same lock, when this shard owns dst, else owed.
    WITH t AS MATERIALIZED (
        SELECT u.*, u.kind = 'transfer_out' AND u.cks IS NOT NULL AND EXISTS (SELECT 1 FROM shardgate_owned_range o WHERE o.active AND o.lo <= u.cks AND (o.hi IS NULL OR u.cks < o.hi)) AS here
          FROM unnest(p_transfer_ids, p_keyspaces, p_accounts, p_counterparties, p_counter_keyspaces, p_amounts,
                      p_currencies, p_kinds, p_references, p_clients, p_keys, p_scopes, p_request_hashes, p_responses, decided, floors)
               WITH ORDINALITY AS u(tid, ks, acct, cp, cks, amount, cur, kind, ref, client, k, s, h, resp, d, kf, i)
         WHERE u.d IS NULL),
    ins AS (
        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        SELECT t.tid, t.ks, t.acct, t.cp, t.amount, t.cur, t.kind, t.ref, t.client FROM t
        ON CONFLICT (transfer_id, kind) DO NOTHING
        RETURNING transfer_id, kind),
    app AS MATERIALIZED (
        SELECT DISTINCT ON (t.tid, t.kind) t.*
          FROM t JOIN ins ON ins.transfer_id = t.tid AND ins.kind = t.kind
         ORDER BY t.tid, t.kind, t.i),
    rec AS (
        INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
        SELECT app.k, app.s, app.h, app.ks, app.resp, 'completed', greatest(now(), app.kf) FROM app),
    credit AS (
        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        SELECT app.tid, app.cks, app.cp, app.acct, app.amount, app.cur, 'transfer_in', app.ref, app.client
          FROM app WHERE app.here
        ON CONFLICT (transfer_id, kind) DO NOTHING),
    owed AS (
        INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
        SELECT app.tid, app.ks, app.acct, app.cp, app.amount, app.cur, app.ref, app.client, now()
          FROM app WHERE app.kind = 'transfer_out' AND NOT app.here)
    SELECT array_agg(CASE WHEN x.d IS NOT NULL THEN x.d WHEN a.i IS NOT NULL THEN 'applied' END ORDER BY x.i),
           array_agg(CASE WHEN a.kind = 'transfer_out' THEN a.here END ORDER BY x.i),
           count(*) FILTER (WHERE x.d IS NULL AND a.i IS NULL)
      INTO decided, settled, unapplied
      FROM unnest(decided) WITH ORDINALITY AS x(d, i)
      LEFT JOIN app a ON a.i = x.i;

    -- 4. A leg the ledger held (rare: another item or an earlier attempt wrote it): expired only
    --    when older than retention (as in 0002), else its record is missing.
    IF unapplied > 0 THEN
        SELECT array_agg(CASE
                   WHEN t.d IS NOT NULL THEN t.d
                   WHEN EXISTS (SELECT 1 FROM ledger_entries l
                                 WHERE l.transfer_id = t.tid AND l.kind = t.kind
                                   AND l.created_at < statement_timestamp() - p_retention) THEN 'expired'
                   ELSE 'record_missing' END ORDER BY t.i)
          INTO decided
          FROM unnest(p_transfer_ids, p_kinds, decided) WITH ORDINALITY AS t(tid, kind, d, i);
    END IF;

    -- 5. Later attempts of a key: in flight behind an earlier attempt that applied; otherwise
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

    IF 'not_owner' = ANY (decided) THEN
        SELECT s.map_version INTO map_version FROM shardgate_shard s;
    END IF;
    RETURN QUERY
    SELECT g.i, decided[g.i], stored[g.i], CASE WHEN decided[g.i] = 'not_owner' THEN map_version END, settled[g.i]
      FROM generate_series(1, n) AS g(i);
END
$fn$;

CREATE OR REPLACE FUNCTION shardgate_apply_rows(
    p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[],
    p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[],
    p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
LANGUAGE plpgsql
SET lock_timeout = '10s'
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    claimed text[] := '{}';   -- scope || E'\n' || key of the items this call claimed
    claimed_hash text[] := '{}';
    here boolean;             -- the item is a debit whose counterparty this shard owns too
    map_version bigint;
    key_floor timestamptz;    -- of the item's key: its record is dated no earlier
    unchecked timestamptz;    -- records dated before this may predate their floor by any time ...
    early interval;           -- ... and any other by at most this
    ident text;
    pos integer;
    if_absent text;
    prior record;
    wrote boolean;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF shardgate_group_args_invalid(n, p_kinds, array_length(p_kinds, 1), array_length(p_scopes, 1),
            array_length(p_request_hashes, 1), array_length(p_keyspaces, 1), array_length(p_transfer_ids, 1),
            array_length(p_clients, 1), array_length(p_accounts, 1), array_length(p_counterparties, 1),
            array_length(p_counter_keyspaces, 1), array_length(p_amounts, 1), array_length(p_currencies, 1),
            array_length(p_references, 1), array_length(p_responses, 1)) THEN
        RAISE EXCEPTION 'shardgate_apply_rows: the item arrays differ in length, or a kind is not transfer_out or transfer_in' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it. Once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    SELECT f.unchecked_before, f.early_by INTO unchecked, early FROM shardgate_record_floor f;
    unchecked := coalesce(unchecked, 'infinity');
    early := coalesce(early, '0');

    FOR i IN 1 .. n LOOP
        idx := i;
        outcome := NULL;
        stored_response := NULL;
        shard_map_version := NULL;
        credit_settled := NULL;
        ident := p_scopes[i] || E'\n' || p_keys[i];

        IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range o
                        WHERE o.active AND o.lo <= p_keyspaces[i] AND (o.hi IS NULL OR p_keyspaces[i] < o.hi)) THEN
            IF map_version IS NULL THEN
                SELECT s.map_version INTO map_version FROM shardgate_shard s;
            END IF;
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
        key_floor := shardgate_key_floor(p_keys[i]);
        SELECT ir.request_hash, ir.state, ir.response INTO prior
          FROM idempotency_record ir
         WHERE ir.scope = p_scopes[i] AND ir.key = p_keys[i]
           AND (ir.created_at >= coalesce(key_floor - early, '-infinity') OR ir.created_at < unchecked);
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

        -- The leg, its completed record dated no earlier than its key's floor (raising 23514 when
        -- upkeep has not created the partition for that date: the whole statement then rolls
        -- back), and a debit's credit: here, fenced by the same lock, when this shard owns dst,
        -- else owed. All or nothing: the leg decides.
        here := p_kinds[i] = 'transfer_out' AND p_counter_keyspaces[i] IS NOT NULL AND EXISTS (
            SELECT 1 FROM shardgate_owned_range o
             WHERE o.active AND o.lo <= p_counter_keyspaces[i] AND (o.hi IS NULL OR p_counter_keyspaces[i] < o.hi));
        WITH leg AS (
            INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
            VALUES (p_transfer_ids[i], p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i], p_currencies[i], p_kinds[i], p_references[i], p_clients[i])
            ON CONFLICT (transfer_id, kind) DO NOTHING
            RETURNING 1),
        rec AS (
            INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
            SELECT p_keys[i], p_scopes[i], p_request_hashes[i], p_keyspaces[i], p_responses[i], 'completed', greatest(now(), key_floor) FROM leg),
        credit AS (
            INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
            SELECT p_transfer_ids[i], p_counter_keyspaces[i], p_counterparties[i], p_accounts[i], p_amounts[i], p_currencies[i], 'transfer_in', p_references[i], p_clients[i]
              FROM leg WHERE here
            ON CONFLICT (transfer_id, kind) DO NOTHING),
        owed AS (
            INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
            SELECT p_transfer_ids[i], p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i], p_currencies[i], p_references[i], p_clients[i], now()
              FROM leg WHERE p_kinds[i] = 'transfer_out' AND NOT here)
        SELECT EXISTS (SELECT 1 FROM leg) INTO wrote;
        IF NOT wrote THEN
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
        IF p_kinds[i] = 'transfer_out' THEN
            credit_settled := here;
        END IF;
        claimed := claimed || ident;
        claimed_hash := claimed_hash || p_request_hashes[i];
        outcome := 'applied';
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- As 0006's: a copied record is dated no earlier than its key's floor, and the key is looked up
-- where a record can be, early_by included.
CREATE OR REPLACE FUNCTION shardgate_copy_records(OUT inserted bigint, OUT conflicts bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    m record;
    held_hash text;
    key_floor timestamptz;
    unchecked timestamptz;
    early interval;
BEGIN
    -- One statement, one snapshot: a bound lowered by upkeep comes with its early_by.
    SELECT f.unchecked_before, f.early_by INTO unchecked, early FROM shardgate_record_floor f;
    unchecked := coalesce(unchecked, 'infinity');
    early := coalesce(early, '0');
    inserted := 0;
    conflicts := 0;
    FOR m IN SELECT * FROM moving_rows ORDER BY scope, key LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(m.scope || E'\n' || m.key, 1));
        key_floor := shardgate_key_floor(m.key);
        SELECT r.request_hash INTO held_hash
          FROM idempotency_record r
         WHERE r.scope = m.scope AND r.key = m.key
           AND (r.created_at >= coalesce(key_floor - early, '-infinity') OR r.created_at < unchecked)
         LIMIT 1;
        IF NOT FOUND THEN
            INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
            VALUES (m.key, m.scope, m.request_hash, m.keyspace_id, m.response, m.state, greatest(m.created_at, key_floor));
            inserted := inserted + 1;
        ELSIF held_hash IS DISTINCT FROM m.request_hash THEN
            conflicts := conflicts + 1;
        END IF;
    END LOOP;
END
$fn$;
