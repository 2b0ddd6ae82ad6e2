-- 0003: group commit. shardgate_transfer_batch runs a group of transfer attempts bound for this
-- shard in one statement and one transaction: one round trip and one commit (one WAL flush) for
-- the group instead of one per attempt. Each item keeps every guarantee of shardgate_transfer
-- (0002): ownership fencing, the per-key try-locks, the lookup across every partition, the
-- ledger's unique transfer id, and its claim, debit and stored response commit together. Items
-- come as parallel arrays; one row per item comes back, idx being its 1-based position.
--
-- Each item's outcome is its own: a neighbour's not_owner, replay, 409 or 422 changes nothing
-- for it. Two attempts of one key in the same group are answered as two concurrent attempts are:
-- the later one sees the earlier one's uncommitted claim as in flight (in_progress, or key_reused
-- for another request hash), never as a replay of a response not yet committed. The try-locks
-- of an advisory xact lock are re-entrant within a transaction, so that case is decided from
-- the claims this call made, before the locks are tried.
--
-- An error in any item (a missing partition, 23514) fails the whole statement, which then
-- commits nothing; the router answers each item by sending it alone.
CREATE FUNCTION shardgate_transfer_batch(
    p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_srcs bigint[], p_dsts bigint[], p_amounts bigint[],
    p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint)
LANGUAGE plpgsql
SET lock_timeout = '10s'
AS $fn$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    claimed text[] := '{}';   -- scope || E'\n' || key of the items this call claimed
    claimed_hash text[] := '{}';
    map_version bigint;
    ident text;
    pos integer;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF array_length(p_scopes, 1) IS DISTINCT FROM n OR array_length(p_request_hashes, 1) IS DISTINCT FROM n
       OR array_length(p_keyspaces, 1) IS DISTINCT FROM n OR array_length(p_transfer_ids, 1) IS DISTINCT FROM n
       OR array_length(p_clients, 1) IS DISTINCT FROM n OR array_length(p_srcs, 1) IS DISTINCT FROM n
       OR array_length(p_dsts, 1) IS DISTINCT FROM n OR array_length(p_amounts, 1) IS DISTINCT FROM n
       OR array_length(p_currencies, 1) IS DISTINCT FROM n OR array_length(p_references, 1) IS DISTINCT FROM n
       OR array_length(p_responses, 1) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'shardgate_transfer_batch: the item arrays differ in length' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change: taken once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    SELECT s.map_version INTO map_version FROM shardgate_shard s;

    FOR i IN 1 .. n LOOP
        idx := i;
        outcome := NULL;
        stored_response := NULL;
        shard_map_version := NULL;
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

        IF NOT pg_try_advisory_xact_lock(hashtextextended(ident || E'\n' || p_request_hashes[i], 2)) THEN
            SELECT po.outcome, po.stored_response INTO outcome, stored_response
              FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], 'in_progress') po;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(ident, 1)) THEN
            SELECT po.outcome, po.stored_response INTO outcome, stored_response
              FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], 'key_reused') po;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], NULL) po;
        IF outcome IS NOT NULL THEN
            RETURN NEXT;
            CONTINUE;
        END IF;

        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        VALUES (p_transfer_ids[i], p_keyspaces[i], p_srcs[i], p_dsts[i], p_amounts[i], p_currencies[i], 'transfer_out', p_references[i], p_clients[i])
        ON CONFLICT (transfer_id, kind) DO NOTHING;
        IF NOT FOUND THEN
            -- As in 0002: expired only for a debit older than retention.
            IF EXISTS (SELECT 1 FROM ledger_entries
                        WHERE transfer_id = p_transfer_ids[i] AND kind = 'transfer_out'
                          AND created_at < statement_timestamp() - p_retention) THEN
                outcome := 'expired';
            ELSE
                outcome := 'record_missing';
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
        VALUES (p_keys[i], p_scopes[i], p_request_hashes[i], p_keyspaces[i], p_responses[i], 'completed');
        claimed := claimed || ident;
        claimed_hash := claimed_hash || p_request_hashes[i];
        outcome := 'applied';
        RETURN NEXT;
    END LOOP;
END
$fn$;
