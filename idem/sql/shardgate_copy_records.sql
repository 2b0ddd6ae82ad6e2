-- requires: shardgate_key_floor
--
-- shardgate_copy_records inserts the idempotency records staged in the temporary table
-- moving_rows (idem.ApplyMap, moving a key range here) that this shard does not hold yet. Each
-- key is copied under the (scope, key) lock the transfer functions take, and looked up afresh
-- after taking it, where a record can be (shardgate_key_floor less early_by, and before
-- unchecked_before), so a copy and a transfer of the same key can never both insert a record:
-- the transfer meanwhile gets in_progress, or the copy finds the transfer's record. A copied
-- record is dated no earlier than its key's floor. It returns how many it inserted, and how
-- many keys this shard already held for a different request (a key reused across shards: its
-- record here wins and the moved one is not copied).
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
