-- shardgate_capture_change lists, in shardgate_range_change, every row written or changed in a
-- range this shard is copying to another shard while it still serves it (shardgate_range_move),
-- with the id of the transaction that wrote it. A move's catch-up reads these to bring the new
-- owner up to date; with no range being moved, it is one look at an empty table per row. Its
-- triggers are defined here with it (below): idempotency records and ledger rows are only ever
-- inserted, owed credits are also updated (leased, deferred, settled). A row trigger on the
-- partitioned idempotency_record is given to every partition, present and future.
CREATE OR REPLACE FUNCTION shardgate_capture_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM shardgate_range_move m
                WHERE NEW.keyspace_id >= m.lo AND (m.hi IS NULL OR NEW.keyspace_id < m.hi)) THEN
        IF TG_ARGV[0] = 'record' THEN
            INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
            VALUES (NEW.keyspace_id, 'record', NEW.scope, NEW.key, pg_current_xact_id());
        ELSIF TG_ARGV[0] = 'ledger' THEN
            INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
            VALUES (NEW.keyspace_id, 'ledger', NEW.transfer_id, NEW.kind, pg_current_xact_id());
        ELSE
            INSERT INTO shardgate_range_change (keyspace_id, tbl, ref_a, ref_b, xid)
            VALUES (NEW.keyspace_id, 'outbox', NEW.transfer_id, NULL, pg_current_xact_id());
        END IF;
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
         WHERE tgname = 'shardgate_capture_change' AND tgparentid = 0
           AND tgrelid IN ('idempotency_record'::regclass, 'ledger_entries'::regclass, 'shardgate_credit_outbox'::regclass)) < 3 THEN
        LOCK TABLE ledger_entries, idempotency_record, shardgate_credit_outbox IN SHARE ROW EXCLUSIVE MODE;
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT ON ledger_entries
            FOR EACH ROW EXECUTE FUNCTION shardgate_capture_change('ledger');
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT ON idempotency_record
            FOR EACH ROW EXECUTE FUNCTION shardgate_capture_change('record');
        CREATE OR REPLACE TRIGGER shardgate_capture_change AFTER INSERT OR UPDATE ON shardgate_credit_outbox
            FOR EACH ROW EXECUTE FUNCTION shardgate_capture_change('outbox');
    END IF;
END
$do$;
