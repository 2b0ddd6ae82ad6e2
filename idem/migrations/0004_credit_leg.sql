-- 0004: the credit leg. A transfer is two ledger rows: the debit (transfer_out) on the shard that
-- owns src and the credit (transfer_in) on the shard that owns dst. Both carry the transfer's id,
-- and the ledger's UNIQUE (transfer_id, kind) admits one credit per transfer, forever.
--
-- When the debit applies, the same transaction either writes the credit too (this shard owns dst
-- now) or records that the credit is owed: a row of shardgate_credit_outbox. The relay in every
-- router delivers owed credits to dst's shard through shardgate_apply_batch, the same claim path
-- as a debit (scope 'shardgate:credit', key = the transfer id), and only then marks the row
-- settled. A delivery that committed but was never acknowledged is delivered again and replays.
--
-- shardgate_apply_batch (set-wise) and shardgate_apply_rows (item by item, cheaper for small
-- groups) became the bodies of a transfer attempt, debit or credit, with one contract; the
-- functions of 0001-0003 became wrappers over them, so routers of the release before kept
-- working during a rolling upgrade and their debits record owed credits too. Functions live in
-- idem/sql/, one file each; this file keeps the tables and the backfill.

-- A credit owed by a debit of this shard. keyspace_id is the source account's, so the row moves
-- with the source's key range. settled_at is the credit's own created_at on dst's shard, set once
-- it is known to be there; delivered rows are deleted by upkeep after relay.keep_settled.
CREATE TABLE shardgate_credit_outbox (
    transfer_id     text        PRIMARY KEY,
    keyspace_id     bigint      NOT NULL,
    src             bigint      NOT NULL,
    dst             bigint      NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    reference       text,
    client          text        NOT NULL,
    debited_at      timestamptz NOT NULL,
    settled_at      timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_until     timestamptz,
    last_error      text
);
-- What the relay scans: pending rows by when they are due.
CREATE INDEX shardgate_credit_outbox_due_idx ON shardgate_credit_outbox (next_attempt_at) WHERE settled_at IS NULL;
CREATE INDEX shardgate_credit_outbox_settled_idx ON shardgate_credit_outbox (settled_at) WHERE settled_at IS NOT NULL;
-- Balances read an account's ledger rows; the pending figure reads its owed credits.
CREATE INDEX shardgate_credit_outbox_src_idx ON shardgate_credit_outbox (src) WHERE settled_at IS NULL;

-- Debits written before this migration never had a credit: they are owed now, and the relay
-- delivers them like any other.
INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
SELECT d.transfer_id, d.keyspace_id, d.account_id, d.counterparty_id, d.amount, d.currency, d.reference, d.client, d.created_at
  FROM ledger_entries d
 WHERE d.kind = 'transfer_out'
   AND NOT EXISTS (SELECT 1 FROM ledger_entries c WHERE c.transfer_id = d.transfer_id AND c.kind = 'transfer_in');

-- A router of the previous release may be mid-statement while this migration runs: a debit its
-- old function body writes and commits after the backfill above never gets an owed row (the
-- body it runs is the one it compiled, whatever this migration replaces). Upkeep therefore
-- sweeps once, when the grace after this migration has passed, every debit of the hour before
-- it and later that has neither its credit here nor an owed row (idem.SweepUpgradeWindow).
CREATE TABLE shardgate_credit_sweep (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    since     timestamptz NOT NULL,
    done_at   timestamptz
);
INSERT INTO shardgate_credit_sweep (since) VALUES (now());
