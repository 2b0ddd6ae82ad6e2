-- A shard as the release with migrations 0001-0007 left it: pg_dump of a database that ran
-- idem/migrations 0001-0007 of revision 7256034. A fixture of a past release for the upgrade tests, not a
-- definition. Written by scripts/release-fixtures.sh; do not edit.
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: shardgate_apply_batch(text[], text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], bigint[], bigint[], text[], text[], jsonb[], interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_apply_batch(p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[], p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[], p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval) RETURNS TABLE(idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
    LANGUAGE plpgsql
    SET lock_timeout TO '10s'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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
$$;


--
-- Name: shardgate_apply_rows(text[], text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], bigint[], bigint[], text[], text[], jsonb[], interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_apply_rows(p_kinds text[], p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[], p_transfer_ids text[], p_clients text[], p_accounts bigint[], p_counterparties bigint[], p_counter_keyspaces bigint[], p_amounts bigint[], p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval) RETURNS TABLE(idx integer, outcome text, stored_response jsonb, shard_map_version bigint, credit_settled boolean)
    LANGUAGE plpgsql
    SET lock_timeout TO '10s'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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
$$;


--
-- Name: shardgate_copy_records(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_copy_records(OUT inserted bigint, OUT conflicts bigint) RETURNS record
    LANGUAGE plpgsql
    AS $$
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
$$;


--
-- Name: shardgate_group_args_invalid(integer, text[], integer[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_group_args_invalid(n integer, kinds text[], VARIADIC lengths integer[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT coalesce(NOT (n = ALL (lengths)), true)
        OR NOT coalesce(kinds <@ ARRAY['transfer_out', 'transfer_in']::text[], false)
$$;


--
-- Name: shardgate_key_floor(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_key_floor(key text) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$
    SELECT CASE WHEN key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$'
                THEN to_timestamp(('x' || substr(key, 1, 8) || substr(key, 10, 4))::bit(48)::bigint / 1000.0) END
$_$;


--
-- Name: shardgate_prior_outcome(text, text, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_prior_outcome(p_scope text, p_key text, p_request_hash text, p_if_absent text, OUT outcome text, OUT stored_response jsonb) RETURNS record
    LANGUAGE plpgsql
    AS $$
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
$$;


--
-- Name: shardgate_transfer(text, text, text, bigint, text, text, bigint, bigint, bigint, text, text, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer(p_scope text, p_key text, p_request_hash text, p_keyspace bigint, p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint, p_currency text, p_reference text, p_response jsonb, OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint) RETURNS record
    LANGUAGE sql
    AS $$
    SELECT t.outcome, t.stored_response, t.shard_map_version
      FROM shardgate_transfer(p_scope, p_key, p_request_hash, p_keyspace, p_transfer_id, p_client,
           p_src, p_dst, p_amount, p_currency, p_reference, p_response, interval '0') t
$$;


--
-- Name: shardgate_transfer(text, text, text, bigint, text, text, bigint, bigint, bigint, text, text, jsonb, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer(p_scope text, p_key text, p_request_hash text, p_keyspace bigint, p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint, p_currency text, p_reference text, p_response jsonb, p_retention interval, OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint) RETURNS record
    LANGUAGE sql
    AS $$
    SELECT b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_rows(ARRAY['transfer_out'], ARRAY[p_scope], ARRAY[p_key], ARRAY[p_request_hash],
           ARRAY[p_keyspace], ARRAY[p_transfer_id], ARRAY[p_client], ARRAY[p_src], ARRAY[p_dst], ARRAY[NULL::bigint],
           ARRAY[p_amount], ARRAY[p_currency], ARRAY[p_reference], ARRAY[p_response], p_retention) b
$$;


--
-- Name: shardgate_transfer_batch(text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], bigint[], text[], text[], jsonb[], interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer_batch(p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[], p_transfer_ids text[], p_clients text[], p_srcs bigint[], p_dsts bigint[], p_amounts bigint[], p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval) RETURNS TABLE(idx integer, outcome text, stored_response jsonb, shard_map_version bigint)
    LANGUAGE sql
    AS $$
    SELECT b.idx, b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_batch(
           array_fill('transfer_out'::text, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_scopes, p_keys, p_request_hashes, p_keyspaces, p_transfer_ids, p_clients, p_srcs, p_dsts,
           array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_amounts, p_currencies, p_references, p_responses, p_retention) b
$$;


SET default_tablespace = '';

--
-- Name: idempotency_record; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.idempotency_record (
    key text NOT NULL,
    scope text NOT NULL,
    request_hash text NOT NULL,
    keyspace_id bigint NOT NULL,
    response jsonb,
    state text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT idempotency_record_check CHECK (((state = 'in_progress'::text) OR (response IS NOT NULL))),
    CONSTRAINT idempotency_record_key_check CHECK (((length(key) >= 1) AND (length(key) <= 255))),
    CONSTRAINT idempotency_record_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'completed'::text])))
)
PARTITION BY RANGE (created_at);


SET default_table_access_method = heap;

--
-- Name: ledger_entries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_entries (
    id bigint NOT NULL,
    transfer_id text NOT NULL,
    keyspace_id bigint NOT NULL,
    account_id bigint NOT NULL,
    counterparty_id bigint NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    kind text NOT NULL,
    reference text,
    client text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ledger_entries_amount_check CHECK ((amount > 0)),
    CONSTRAINT ledger_entries_currency_check CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT ledger_entries_kind_check CHECK ((kind = ANY (ARRAY['transfer_out'::text, 'transfer_in'::text])))
);


--
-- Name: ledger_entries_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.ledger_entries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.ledger_entries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: shardgate_credit_outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_credit_outbox (
    transfer_id text NOT NULL,
    keyspace_id bigint NOT NULL,
    src bigint NOT NULL,
    dst bigint NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    reference text,
    client text NOT NULL,
    debited_at timestamp with time zone NOT NULL,
    settled_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_until timestamp with time zone,
    last_error text,
    CONSTRAINT shardgate_credit_outbox_amount_check CHECK ((amount > 0))
);


--
-- Name: shardgate_credit_sweep; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_credit_sweep (
    singleton boolean DEFAULT true NOT NULL,
    since timestamp with time zone NOT NULL,
    done_at timestamp with time zone,
    CONSTRAINT shardgate_credit_sweep_singleton_check CHECK (singleton)
);


--
-- Name: shardgate_owned_range; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_owned_range (
    key_range text NOT NULL,
    lo bigint NOT NULL,
    hi bigint,
    active boolean DEFAULT true NOT NULL,
    copied boolean DEFAULT false NOT NULL,
    CONSTRAINT shardgate_owned_range_check CHECK ((NOT (active AND copied))),
    CONSTRAINT shardgate_owned_range_check1 CHECK (((hi IS NULL) OR (lo < hi)))
);


--
-- Name: shardgate_record_floor; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_record_floor (
    singleton boolean DEFAULT true NOT NULL,
    unchecked_before timestamp with time zone NOT NULL,
    early_by interval DEFAULT '00:00:00'::interval NOT NULL,
    CONSTRAINT early_by_not_negative CHECK ((early_by >= '00:00:00'::interval)),
    CONSTRAINT shardgate_record_floor_singleton_check CHECK (singleton)
);


--
-- Name: shardgate_schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: shardgate_shard; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_shard (
    singleton boolean DEFAULT true NOT NULL,
    shard_name text NOT NULL,
    map_version bigint NOT NULL,
    applying_version bigint DEFAULT 0 NOT NULL,
    applying_digest text DEFAULT ''::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT shardgate_shard_map_version_check CHECK ((map_version >= 0)),
    CONSTRAINT shardgate_shard_singleton_check CHECK (singleton)
);


--
-- Data for Name: ledger_entries; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: shardgate_credit_outbox; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: shardgate_credit_sweep; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.shardgate_credit_sweep VALUES (true, '2026-01-01 00:00:00+00', NULL);


--
-- Data for Name: shardgate_owned_range; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: shardgate_record_floor; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.shardgate_record_floor VALUES (true, '2026-01-01 01:00:00+00', '00:00:00');


--
-- Data for Name: shardgate_schema_migrations; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.shardgate_schema_migrations VALUES (1, 'transfers', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (2, 'expired_needs_old_debit', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (3, 'transfer_batch', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (4, 'credit_leg', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (5, 'leaner_groups', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (6, 'records_from_key_time', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (7, 'early_records', '2026-01-01 00:00:00+00');


--
-- Data for Name: shardgate_shard; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Name: ledger_entries_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.ledger_entries_id_seq', 1, false);


--
-- Name: idempotency_record idempotency_record_not_before_key_floor; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.idempotency_record
    ADD CONSTRAINT idempotency_record_not_before_key_floor CHECK (
CASE
    WHEN (key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$'::text) THEN (created_at >= to_timestamp(((((((('x'::text || substr(key, 1, 8)) || substr(key, 10, 4)))::bit(48))::bigint)::numeric / 1000.0))::double precision))
    ELSE true
END) NOT VALID;


--
-- Name: ledger_entries ledger_entries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_entries
    ADD CONSTRAINT ledger_entries_pkey PRIMARY KEY (id);


--
-- Name: ledger_entries ledger_entries_transfer_kind_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_entries
    ADD CONSTRAINT ledger_entries_transfer_kind_key UNIQUE (transfer_id, kind);


--
-- Name: shardgate_credit_outbox shardgate_credit_outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_credit_outbox
    ADD CONSTRAINT shardgate_credit_outbox_pkey PRIMARY KEY (transfer_id);


--
-- Name: shardgate_credit_sweep shardgate_credit_sweep_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_credit_sweep
    ADD CONSTRAINT shardgate_credit_sweep_pkey PRIMARY KEY (singleton);


--
-- Name: shardgate_owned_range shardgate_owned_range_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_owned_range
    ADD CONSTRAINT shardgate_owned_range_pkey PRIMARY KEY (key_range);


--
-- Name: shardgate_record_floor shardgate_record_floor_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_record_floor
    ADD CONSTRAINT shardgate_record_floor_pkey PRIMARY KEY (singleton);


--
-- Name: shardgate_schema_migrations shardgate_schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_schema_migrations
    ADD CONSTRAINT shardgate_schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: shardgate_shard shardgate_shard_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_shard
    ADD CONSTRAINT shardgate_shard_pkey PRIMARY KEY (singleton);


--
-- Name: ledger_entries_account_created_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ledger_entries_account_created_idx ON public.ledger_entries USING btree (account_id, created_at);


--
-- Name: shardgate_credit_outbox_due_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX shardgate_credit_outbox_due_idx ON public.shardgate_credit_outbox USING btree (next_attempt_at) WHERE (settled_at IS NULL);


--
-- Name: shardgate_credit_outbox_settled_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX shardgate_credit_outbox_settled_idx ON public.shardgate_credit_outbox USING btree (settled_at) WHERE (settled_at IS NOT NULL);


--
-- Name: shardgate_credit_outbox_src_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX shardgate_credit_outbox_src_idx ON public.shardgate_credit_outbox USING btree (src) WHERE (settled_at IS NULL);


--
-- PostgreSQL database dump complete
--


