-- 0002: "expired" is concluded only from a debit older than retention.
--
-- shardgate_transfer gains p_retention. When the ledger already holds the transfer's debit but no
-- idempotency record is found, the outcome is 'expired' only if that debit is older than
-- retention; otherwise it is 'record_missing' (an inconsistency the router answers with a
-- retryable 503 and an alert, never a final 422). Outcomes are otherwise those of 0001.
--
-- The 12-argument function of 0001 stays, so that routers of the previous release keep working
-- during a rolling upgrade; routers of this release call the 13-argument one.
CREATE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb, p_retention interval,
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
        -- The transfer is in the ledger and its record is not to be found. Only retention may
        -- have dropped the record, and only once the debit itself is older than retention: a
        -- younger debit without its record means the record's partition is unreadable (detached
        -- by hand, say). Answering "expired" then would be final to the client for a transfer
        -- whose stored response exists, so the router fails closed with a retryable error.
        IF EXISTS (SELECT 1 FROM ledger_entries
                    WHERE transfer_id = p_transfer_id AND kind = 'transfer_out'
                      AND created_at < statement_timestamp() - p_retention) THEN
            outcome := 'expired';
        ELSE
            outcome := 'record_missing';
        END IF;
        RETURN;
    END IF;
    -- Raises 23514 (no partition of relation ... found for row) when upkeep has not created the
    -- partition for now(); the whole statement, debit included, then rolls back.
    INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
    VALUES (p_key, p_scope, p_request_hash, p_keyspace, p_response, 'completed');
    outcome := 'applied';
END
$fn$;

