-- requires: shardgate_group_args_invalid shardgate_key_floor shardgate_credit_lease
--
-- shardgate_apply_batch runs a group of transfer attempts, each one leg (p_kinds: transfer_out
-- or transfer_in) of one transfer, in one statement and one transaction. Per item, with
-- p_keyspaces the keyspace id of the leg's own account (src for a debit, dst for a credit):
--   not_owner    this shard does not own p_keyspaces[i]; shard_map_version says which map it follows
--   key_reused   (scope, key) belongs to another request hash, stored or in flight
--   in_progress  the same request is in flight (another transaction, or earlier in this group)
--   replayed     a completed record with the same hash exists; stored_response is its response.
--                A credit (transfer_in) has no record of its own: its ledger row is its record.
--                It is replayed when that row holds what the item would write, and key_reused
--                when it holds anything else; stored_response is then the item's own response
--   expired      the leg is in the ledger, older than p_retention, and its record is gone
--   record_missing  the leg is in the ledger, younger than p_retention, and its record is gone
--                (a retryable 503 and an alert, never a final 422)
--   applied      the leg, its completed record, and for a debit its credit or owed credit
--                were written. credit_settled says which: true when this shard owns
--                p_counter_keyspaces[i] (dst's keyspace id; NULL never) and wrote the credit in
--                this transaction, false when it recorded the credit as owed (leased to the
--                connection's router when it says it delivers its own: shardgate_credit_lease).
--
-- Concurrency: a try-lock on (scope, key, request hash), then on (scope, key); try-locks never
-- wait, so a duplicate is answered at once, and a lookup across the partitions follows, in a
-- later statement, so that its snapshot sees whatever committed before the locks were taken.
-- Taking the request-hash lock first is what lets a concurrent attempt with a different body get
-- key_reused rather than in_progress. Two attempts of one key in one group are answered as two
-- concurrent attempts are: the later one is in flight (in_progress, or key_reused for another
-- request) behind an earlier one that applied, whose claim is not committed; otherwise it gets
-- what a lone attempt gets. An error in any item (a missing partition, 23514) fails the whole
-- statement, which then commits nothing.
--
-- How the work is put to PostgreSQL (measured with pg_stat_statements and idem's
-- BenchmarkGroupFunctions):
--   - set-wise, a statement per step for all items: PostgreSQL sets up the executor and the
--     tables' constraint and default expressions once per statement, which costs more than a row;
--   - plan_cache_mode = force_generic_plan: the statements take the item arrays as parameters,
--     so a custom plan always looked cheaper and was planned afresh on each call;
--   - the leg, its record and the debit's credit or owed credit are written in one statement
--     (data-modifying CTEs need no fresher snapshot than the lookup's);
--   - a key's record is looked up only where it can be: a UUIDv7 key carries the time it was
--     made (shardgate_key_floor), no record is dated before it less shardgate_record_floor's
--     early_by, and partitions before unchecked_before (records written before that rule) are
--     always read;
--   - a credit writes its ledger row alone, and is looked up there (one probe of the ledger's
--     unique (transfer_id, kind)): the ledger row is what makes a credit apply once, its fields
--     are everything the credit's request hash covers, and its key (the transfer id) carries no
--     time, so a record of its own would cost a row, and a lookup in every partition for it and
--     for every other item of its group. Credit records written by earlier releases are left to
--     expire with their partitions and are not read.
-- shardgate_apply_rows has the same contract item by item; idem.setWiseFrom chooses.
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
           CASE WHEN bool_and(o.key_floor IS NOT NULL OR o.credit)
                THEN coalesce(min(o.key_floor), 'infinity') - coalesce((SELECT f.early_by FROM shardgate_record_floor f), '0')
                ELSE '-infinity' END,
           coalesce((SELECT f.unchecked_before FROM shardgate_record_floor f), 'infinity')
      INTO decided, later, floors, lookup_floor, unchecked
      FROM (SELECT w.i, w.key_floor, w.credit, CASE
                   WHEN NOT w.owned THEN 'not_owner'
                   WHEN w.first < w.i THEN 'later'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident || E'\n' || w.request_hash, 2)) THEN 'in_progress'
                   WHEN NOT pg_try_advisory_xact_lock(hashtextextended(w.ident, 1)) THEN 'key_reused'
                   END AS early
              FROM (SELECT v.*, min(v.i) FILTER (WHERE v.owned) OVER (PARTITION BY v.ident) AS first
                      FROM (SELECT t.i::integer AS i, t.s || E'\n' || t.k AS ident, t.h AS request_hash, shardgate_key_floor(t.k) AS key_floor,
                                   t.kind = 'transfer_in' AS credit,
                                   EXISTS (SELECT 1 FROM shardgate_owned_range o WHERE o.active AND o.lo <= t.ks AND (o.hi IS NULL OR t.ks < o.hi)) AS owned
                              FROM unnest(p_scopes, p_keys, p_request_hashes, p_keyspaces, p_kinds) WITH ORDINALITY AS t(s, k, h, ks, kind, i)) v) w) o;

    -- 2. A fresh snapshot, after the locks: each key's record, in whatever partition it can be.
    --    The bounds are parameters known when the statement starts, so PostgreSQL leaves out
    --    (initial pruning) every partition that ends before lookup_floor and begins at or after
    --    unchecked. A credit is looked up in the ledger instead. Each LIMIT 1 keeps its subquery
    --    apart, so that the item's own conditions gate it (a one-time filter): a debit reads no
    --    ledger here, a credit no records. A record (a credit's ledger row) decides; without one, a
    --    lock held elsewhere does.
    SELECT array_agg(CASE
               WHEN t.early IN ('not_owner', 'later') THEN t.early
               WHEN t.kind = 'transfer_in' THEN CASE WHEN leg.same THEN 'replayed' WHEN NOT leg.same THEN 'key_reused' ELSE t.early END
               WHEN rec.request_hash IS NULL THEN t.early
               WHEN rec.request_hash <> t.h THEN 'key_reused'
               WHEN rec.state = 'completed' THEN 'replayed'
               ELSE 'in_progress' END ORDER BY t.i),
           array_agg(CASE WHEN leg.same THEN t.resp
                          WHEN rec.request_hash = t.h AND rec.state = 'completed' THEN rec.response END ORDER BY t.i)
      INTO decided, stored
      FROM unnest(p_kinds, p_scopes, p_keys, p_request_hashes, p_responses, p_transfer_ids, p_keyspaces, p_accounts,
                  p_counterparties, p_amounts, p_currencies, p_references, p_clients, decided)
           WITH ORDINALITY AS t(kind, s, k, h, resp, tid, ks, acct, cp, amount, cur, ref, client, early, i)
      LEFT JOIN LATERAL (SELECT ir.request_hash, ir.state, ir.response FROM idempotency_record ir
                          WHERE ir.scope = t.s AND ir.key = t.k
                            AND (ir.created_at >= lookup_floor OR ir.created_at < unchecked)
                            AND t.kind <> 'transfer_in'
                            AND t.early IS DISTINCT FROM 'not_owner'
                            AND t.early IS DISTINCT FROM 'later'
                          LIMIT 1) rec ON true
      LEFT JOIN LATERAL (SELECT (l.keyspace_id, l.account_id, l.counterparty_id, l.amount, l.currency, l.reference, l.client)
                                IS NOT DISTINCT FROM (t.ks, t.acct, t.cp, t.amount, t.cur, t.ref, t.client) AS same
                           FROM ledger_entries l
                          WHERE l.transfer_id = t.tid AND l.kind = 'transfer_in'
                            AND t.kind = 'transfer_in'
                            AND t.early IS DISTINCT FROM 'not_owner'
                            AND t.early IS DISTINCT FROM 'later'
                          LIMIT 1) leg ON true;

    -- 3. One statement writes what the items still undecided apply: the leg (the ledger's unique
    --    (transfer_id, kind) refuses one it holds already, record or no record; an inserted leg
    --    is the first undecided item's of its (transfer_id, kind), and any other item under the
    --    same transfer id finds it in the ledger, as it would row by row), a debit's completed
    --    record, dated no earlier than its key's floor (raising 23514 when upkeep has not created the
    --    partition for that date: the whole statement, and so the group, then rolls back), and a
    --    debit's credit: here, fenced by the same lock, when this shard owns dst, else owed
    --    (leased to the connection's router if it delivers its own credits).
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
        SELECT app.k, app.s, app.h, app.ks, app.resp, 'completed', greatest(now(), app.kf) FROM app
         WHERE app.kind = 'transfer_out'),
    credit AS (
        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        SELECT app.tid, app.cks, app.cp, app.acct, app.amount, app.cur, 'transfer_in', app.ref, app.client
          FROM app WHERE app.here
        ON CONFLICT (transfer_id, kind) DO NOTHING),
    owed AS (
        INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at,
                                             attempts, lease_owner, lease_until)
        SELECT app.tid, app.ks, app.acct, app.cp, app.amount, app.cur, app.ref, app.client, now(),
               CASE WHEN l.owner IS NOT NULL THEN 1 ELSE 0 END, l.owner, l.until
          FROM app, shardgate_credit_lease() l WHERE app.kind = 'transfer_out' AND NOT app.here)
    SELECT array_agg(CASE WHEN x.d IS NOT NULL THEN x.d WHEN a.i IS NOT NULL THEN 'applied' END ORDER BY x.i),
           array_agg(CASE WHEN a.kind = 'transfer_out' THEN a.here END ORDER BY x.i),
           count(*) FILTER (WHERE x.d IS NULL AND a.i IS NULL)
      INTO decided, settled, unapplied
      FROM unnest(decided) WITH ORDINALITY AS x(d, i)
      LEFT JOIN app a ON a.i = x.i;

    -- 4. A leg the ledger held (rare: another item or an earlier attempt wrote it): expired only
    --    when older than retention, else its record is missing.
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
