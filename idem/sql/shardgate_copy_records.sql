-- requires: shardgate_key_floor
--
-- shardgate_copy_records inserts the idempotency records staged in the temporary table
-- moving_rows (idem.ApplyMap, moving a key range here) that this shard does not hold yet. It
-- first takes the (scope, key) lock the transfer functions take, for every staged key, in
-- (scope, key) order, and only then, in a statement whose snapshot is taken after the locks are
-- held, looks each key up where a record can be (shardgate_key_floor less early_by, and before
-- unchecked_before) and inserts the missing ones, all at once: so a copy and a transfer of the
-- same key can never both insert a record (the transfer meanwhile gets in_progress, or the copy
-- finds the transfer's record). A copied record is dated no earlier than its key's floor. A key
-- staged twice is copied once. It returns how many it inserted, and how many keys this shard
-- already held for a different request (a key reused across shards: its record here wins and
-- the moved one is not copied).
CREATE OR REPLACE FUNCTION shardgate_copy_records(OUT inserted bigint, OUT conflicts bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    unchecked timestamptz;
    early interval;
BEGIN
    PERFORM count(pg_advisory_xact_lock(hashtextextended(k.scope || E'\n' || k.key, 1)))
       FROM (SELECT DISTINCT scope, key FROM moving_rows ORDER BY scope, key OFFSET 0) k;
    -- One statement, one snapshot: a bound lowered by upkeep comes with its early_by.
    SELECT f.unchecked_before, f.early_by INTO unchecked, early FROM shardgate_record_floor f;
    unchecked := coalesce(unchecked, 'infinity');
    early := coalesce(early, '0');
    WITH m AS (
        SELECT DISTINCT ON (mr.scope, mr.key) mr.*, shardgate_key_floor(mr.key) AS key_floor
          FROM moving_rows mr ORDER BY mr.scope, mr.key),
    held AS (
        SELECT m.*, (SELECT r.request_hash FROM idempotency_record r
                      WHERE r.scope = m.scope AND r.key = m.key
                        AND (r.created_at >= coalesce(m.key_floor - early, '-infinity') OR r.created_at < unchecked)
                      LIMIT 1) AS held_hash
          FROM m),
    ins AS (
        INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
        SELECT h.key, h.scope, h.request_hash, h.keyspace_id, h.response, h.state, greatest(h.created_at, h.key_floor)
          FROM held h WHERE h.held_hash IS NULL
        RETURNING 1)
    SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM held WHERE held_hash IS DISTINCT FROM request_hash AND held_hash IS NOT NULL)
      INTO inserted, conflicts;
END
$fn$;
