-- requires: shardgate_group_args_invalid shardgate_key_floor shardgate_credit_lease
--
-- shardgate_apply_rows is shardgate_apply_batch item by item: a few statements per item
-- instead of a few per group. For a small group that is cheaper (the set-wise statements cost
-- more to set up than a handful of rows costs); from a few items on the set-wise function wins
-- (idem.setWiseFrom chooses). The contract, outcomes and locking are the same; the idem tests
-- run the same cases through both. An item's leg, record and credit are written in one
-- statement, and its record is looked up only where it can be, as in shardgate_apply_batch; a
-- credit (transfer_in) has no record and is looked up in the ledger.
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
        IF p_kinds[i] = 'transfer_in' THEN
            -- A credit's ledger row is its record: the same row replays, any other is another request.
            SELECT CASE WHEN (l.keyspace_id, l.account_id, l.counterparty_id, l.amount, l.currency, l.reference, l.client)
                             IS NOT DISTINCT FROM (p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i],
                                                   p_currencies[i], p_references[i], p_clients[i])
                        THEN p_request_hashes[i] ELSE '' END AS request_hash,
                   'completed' AS state, p_responses[i] AS response INTO prior
              FROM ledger_entries l
             WHERE l.transfer_id = p_transfer_ids[i] AND l.kind = 'transfer_in';
        ELSE
            SELECT ir.request_hash, ir.state, ir.response INTO prior
              FROM idempotency_record ir
             WHERE ir.scope = p_scopes[i] AND ir.key = p_keys[i]
               AND (ir.created_at >= coalesce(key_floor - early, '-infinity') OR ir.created_at < unchecked);
        END IF;
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

        -- The leg, a debit's completed record dated no earlier than its key's floor (raising 23514 when
        -- upkeep has not created the partition for that date: the whole statement then rolls
        -- back), and a debit's credit: here, fenced by the same lock, when this shard owns dst,
        -- else owed (leased to the connection's router if it delivers its own credits). All or
        -- nothing: the leg decides.
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
            SELECT p_keys[i], p_scopes[i], p_request_hashes[i], p_keyspaces[i], p_responses[i], 'completed', greatest(now(), key_floor)
              FROM leg WHERE p_kinds[i] = 'transfer_out'),
        credit AS (
            INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
            SELECT p_transfer_ids[i], p_counter_keyspaces[i], p_counterparties[i], p_accounts[i], p_amounts[i], p_currencies[i], 'transfer_in', p_references[i], p_clients[i]
              FROM leg WHERE here
            ON CONFLICT (transfer_id, kind) DO NOTHING),
        owed AS (
            INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at,
                                                 attempts, lease_owner, lease_until)
            SELECT p_transfer_ids[i], p_keyspaces[i], p_accounts[i], p_counterparties[i], p_amounts[i], p_currencies[i], p_references[i], p_clients[i], now(),
                   CASE WHEN l.owner IS NOT NULL THEN 1 ELSE 0 END, l.owner, l.until
              FROM leg, shardgate_credit_lease() l WHERE p_kinds[i] = 'transfer_out' AND NOT here)
        SELECT EXISTS (SELECT 1 FROM leg) INTO wrote;
        IF NOT wrote THEN
            -- Expired only for a leg older than retention.
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
