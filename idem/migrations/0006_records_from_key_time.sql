-- 0006: a key's record is looked up only where it can be. Same signatures, outcomes, locks and
-- order of checks as 0005.
--
-- Measured: a lookup of a key's record reads every partition of idempotency_record, and in
-- shardgate_apply_batch's generic plan it first opens an index scan on each. With the default
-- retention (30 days of daily partitions and 3 ahead, 36 in all) that cost a group of four new
-- keys 2.4 ms instead of 1.1 ms on a fresh shard's four partitions (pgbench, one client); the
-- lookup alone took 1.0 ms of it. A UUIDv7 key carries the time it was made, and no record of it
-- can be older than that, so the lookup can skip every partition that ends before then:
--   - shardgate_key_floor(key) is that time for a UUIDv7 key in canonical form (what router's
--     keyTime reads), and NULL for any other key (those are looked up in every partition);
--   - a CHECK makes it the database's rule that a record is never dated before its key's floor,
--     and every function that writes a record dates it greatest(now(), floor): a client clock a
--     little ahead of the shard's moves the record's date forward, never the lookup past it;
--   - records written before this migration were never held to the rule (the CHECK is NOT VALID
--     for them), so shardgate_record_floor.unchecked_before (the end of the latest partition
--     attached when this migration ran) keeps every partition before it in every lookup; those
--     partitions leave with retention.
-- Functions live in idem/sql/, one file each; this file keeps the constraint and the table.

-- The rule for every record written from now on: created_at >= shardgate_key_floor(key), spelled
-- out. A CHECK that calls the SQL function inlines it, parsing its body, in every statement that
-- inserts a record (measured: 60 to 100 µs a statement); idem's TestKeyFloorAndTheRuleAgree holds
-- the two spellings together. NOT VALID: the rows already here are not read (on a large table
-- that would be a long scan under this migration's lock), and partitions created later are empty
-- when they get it.
--
-- Adding it takes idempotency_record's ACCESS EXCLUSIVE lock for a moment, so it waits for the
-- transfers in flight, and the transfers that come meanwhile wait behind it: at most 10 s, then
-- this migration fails whole (router migrate says so) and can simply be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE idempotency_record
    ADD CONSTRAINT idempotency_record_not_before_key_floor CHECK (CASE
        WHEN key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$'
        THEN created_at >= to_timestamp(('x' || substr(key, 1, 8) || substr(key, 10, 4))::bit(48)::bigint / 1000.0)
        ELSE true END) NOT VALID;

-- One row: records dated before unchecked_before may predate their key's floor. Every record
-- already here lies in a partition attached now, so the end of the latest of them bounds their
-- dates whatever the clocks did (and an hour from now, when there is none yet).
CREATE TABLE shardgate_record_floor (
    singleton        boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    unchecked_before timestamptz NOT NULL
);
INSERT INTO shardgate_record_floor (unchecked_before)
SELECT greatest(now() + interval '1 hour',
                max(substring(pg_get_expr(c.relpartbound, c.oid) FROM $re$ TO \('([^']+)'\)$re$)::timestamptz))
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'idempotency_record'::regclass;
