-- 0011: online range moves. A key range moves while its old owner keeps serving it: a bulk copy
-- in keyset batches, then catch-up passes over the changes captured since, and only the last,
-- small pass behind the fence (idem.Revoke → last changes → idem.Grant). Afterwards the old
-- owner deletes the moved rows in small batches, in the background.
--
-- A range's rows, found without reading the table, in the order of the copy's keyset batches.
-- Built online (concurrently, partition by partition for idempotency_record, before this file's
-- statements): transfers go on meanwhile.
-- shardgate: online-index idempotency_record_keyspace_idx ON idempotency_record (keyspace_id, scope, key)
-- shardgate: online-index ledger_entries_keyspace_idx ON ledger_entries (keyspace_id, id)
-- shardgate: online-index shardgate_credit_outbox_keyspace_idx ON shardgate_credit_outbox (keyspace_id, transfer_id)

-- A range this shard still owns and serves while its rows are copied to dst (the source side
-- of a move, rangemove). While a row is here, every row written or changed in the range is
-- listed in shardgate_range_change. stage and the after_ columns are the bulk copy's cursor
-- (the last row copied of the table being copied), so a stopped apply resumes where it stopped.
CREATE TABLE shardgate_range_move (
    key_range    text        PRIMARY KEY,
    lo           bigint      NOT NULL,
    hi           bigint,
    dst          text        NOT NULL,           -- name of the shard the rows go to
    map_version  bigint      NOT NULL,           -- of the map whose apply started the move
    phase        text        NOT NULL DEFAULT 'copying' CHECK (phase IN ('copying', 'catching_up', 'fenced')),
    stage        text        NOT NULL DEFAULT 'records' CHECK (stage IN ('records', 'ledger', 'outbox', 'done')),
    after_ks     bigint,
    after_a      text,
    after_b      text,
    rows_total   bigint      NOT NULL DEFAULT 0, -- rows of the range when the copy began
    rows_copied  bigint      NOT NULL DEFAULT 0, -- by the bulk copy
    changes_done bigint      NOT NULL DEFAULT 0, -- changes caught up
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (hi IS NULL OR lo < hi)
);

-- A row written or changed in a range being moved out (shardgate_capture_change), with the id of
-- the transaction that did it: a catch-up pass takes only changes of transactions older than
-- every transaction still running, so a late commit is never passed over.
CREATE TABLE shardgate_range_change (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    keyspace_id bigint NOT NULL,
    tbl         text   NOT NULL CHECK (tbl IN ('record', 'ledger', 'outbox')),
    ref_a       text   NOT NULL, -- record: scope; ledger and outbox: transfer_id
    ref_b       text,            -- record: key; ledger: kind
    xid         xid8   NOT NULL
);
CREATE INDEX shardgate_range_change_keyspace_idx ON shardgate_range_change (keyspace_id, id);

-- A range whose rows here moved to another shard that now owns them: they are deleted in small
-- batches (idem.PurgeMoved), each a short transaction, so no transfer waits on it.
CREATE TABLE shardgate_range_purge (
    key_range text        PRIMARY KEY,
    lo        bigint      NOT NULL,
    hi        bigint,
    since     timestamptz NOT NULL DEFAULT now(),
    CHECK (hi IS NULL OR lo < hi)
);
