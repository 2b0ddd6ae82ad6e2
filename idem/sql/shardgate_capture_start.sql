-- requires: shardgate_capture_change
-- shardgate_capture_start creates the change-capture triggers (shardgate_capture_change) when a
-- move is listed in shardgate_range_move, in the transaction that lists it, so that no router,
-- of whatever release, can start a move without them. It fires after the statement that lists
-- the move, so the move's row count (which may read a large range) is taken before any lock.
--
-- It takes each table's SHARE ROW EXCLUSIVE lock, in the order a transfer takes its tables'
-- locks (ledger_entries, idempotency_record, shardgate_credit_outbox), so the two never wait on
-- each other in a cycle: the lock waits for the transfers writing the tables to end, so a
-- transfer has either committed before the triggers exist or writes with them. The locks are
-- taken whether or not the triggers exist, and the catalog is read after them: a
-- DropIdleCapture that was dropping them meanwhile has then committed (it holds ACCESS
-- EXCLUSIVE), and one that comes later sees the move and keeps them. The caller bounds the
-- wait with lock_timeout (idem.WithBriefLocks): transfers queue behind a waiting lock.
CREATE OR REPLACE FUNCTION shardgate_capture_start() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    tg  text;
    ev  text;
    tbl text;
    arg text;
BEGIN
    LOCK TABLE ledger_entries, idempotency_record, shardgate_credit_outbox IN SHARE ROW EXCLUSIVE MODE;
    IF (SELECT count(*) FROM pg_trigger
         WHERE tgname LIKE 'shardgate_capture_change%' AND tgparentid = 0
           AND tgrelid IN ('idempotency_record'::regclass, 'ledger_entries'::regclass, 'shardgate_credit_outbox'::regclass)) < 4 THEN
        -- Records and ledger rows are only ever inserted; owed credits are also updated (leased,
        -- deferred, settled).
        FOR tg, ev, tbl, arg IN SELECT * FROM (VALUES
            ('shardgate_capture_change', 'INSERT', 'ledger_entries', 'ledger'),
            ('shardgate_capture_change', 'INSERT', 'idempotency_record', 'record'),
            ('shardgate_capture_change', 'INSERT', 'shardgate_credit_outbox', 'outbox'),
            ('shardgate_capture_change_update', 'UPDATE', 'shardgate_credit_outbox', 'outbox')) AS t
        LOOP
            EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER %s ON %I REFERENCING NEW TABLE AS shardgate_new_rows
                            FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_change(%L)', tg, ev, tbl, arg);
        END LOOP;
    END IF;
    RETURN NULL;
END
$fn$;

-- Re-applying this file replaces the trigger on the small shardgate_range_move alone; the
-- capture triggers are left as they are.
CREATE OR REPLACE TRIGGER shardgate_capture_start AFTER INSERT ON shardgate_range_move
    FOR EACH STATEMENT EXECUTE FUNCTION shardgate_capture_start();
