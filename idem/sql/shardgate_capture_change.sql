-- shardgate_capture_change lists, in shardgate_range_change, every row written or changed in a
-- range this shard is copying to another shard while it still serves it (shardgate_range_move),
-- with the id of the transaction that wrote it. A move's catch-up reads these to bring the new
-- owner up to date. It runs once per statement, over the statement's rows (its transition
-- table): with no range being moved, that is one look at an empty table per statement.
-- Its triggers are defined here with it (below): idempotency records and ledger rows are only
-- ever inserted, owed credits are also updated (leased, deferred, settled). A statement trigger
-- on the partitioned idempotency_record sees the rows of every partition.
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

-- The triggers are created once, when missing: re-applying this file replaces the function and
-- takes no lock on the tables. Creating them takes each table's SHARE ROW EXCLUSIVE lock for a
-- moment, in the order a transfer takes its tables' locks, so the two never wait on each other
-- in a cycle.
DO $do$
BEGIN
    IF (SELECT count(*) FROM pg_trigger
         WHERE tgname LIKE 'shardgate_capture_change%' AND tgparentid = 0
           AND tgrelid IN ('idempotency_record'::regclass, 'ledger_entries'::regclass, 'shardgate_credit_outbox'::regclass)) < 4 THEN
        LOCK TABLE ledger_entries, idempotency_record, shardgate_credit_outbox IN SHARE ROW EXCLUSIVE MODE;
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT ON ledger_entries
            REFERENCING NEW TABLE AS shardgate_new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_change('ledger');
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT ON idempotency_record
            REFERENCING NEW TABLE AS shardgate_new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_change('record');
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT ON shardgate_credit_outbox
            REFERENCING NEW TABLE AS shardgate_new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_change('outbox');
        CREATE OR REPLACE TRIGGER shardgate_capture_change_update AFTER UPDATE ON shardgate_credit_outbox
            REFERENCING NEW TABLE AS shardgate_new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_change('outbox');
    END IF;
END
$do$;
