-- shardgate_capture_change lists, in shardgate_range_change, every row written or changed in a
-- range this shard is copying to another shard while it still serves it (shardgate_range_move),
-- with the id of the transaction that wrote it. A move's catch-up reads these to bring the new
-- owner up to date. It runs once per statement, over the statement's rows (its transition
-- table). Its triggers exist only while the shard lists a move: listing one creates them
-- (shardgate_capture_start), and idem.DropIdleCapture drops them once none is left, because every
-- insert into the three tables pays for them (the transition table, the call). Idempotency
-- records and ledger rows are only ever inserted, owed credits are also updated (leased,
-- deferred, settled). A statement trigger on the partitioned idempotency_record sees the rows of
-- every partition.
CREATE OR REPLACE FUNCTION shardgate_capture_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM shardgate_range_move) THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'record' THEN
        INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
        SELECT n.keyspace_id, 'record', n.scope, n.key, pg_current_xact_id() FROM shardgate_new_rows n
         WHERE EXISTS (SELECT 1 FROM shardgate_range_move m WHERE n.keyspace_id >= m.lo AND (m.hi IS NULL OR n.keyspace_id < m.hi));
    ELSIF TG_ARGV[0] = 'ledger' THEN
        INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
        SELECT n.keyspace_id, 'ledger', n.transfer_id, n.kind, pg_current_xact_id() FROM shardgate_new_rows n
         WHERE EXISTS (SELECT 1 FROM shardgate_range_move m WHERE n.keyspace_id >= m.lo AND (m.hi IS NULL OR n.keyspace_id < m.hi));
    ELSE
        INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
        SELECT n.keyspace_id, 'outbox', n.transfer_id, NULL, pg_current_xact_id() FROM shardgate_new_rows n
         WHERE EXISTS (SELECT 1 FROM shardgate_range_move m WHERE n.keyspace_id >= m.lo AND (m.hi IS NULL OR n.keyspace_id < m.hi));
    END IF;
    RETURN NULL;
END
$fn$;
