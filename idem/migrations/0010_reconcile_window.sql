-- 0010: indexes for a reconcile over a recent window (`router reconcile --since`, and the
-- periodic check of `router serve`): the ledger's rows and the owed credits by when they were
-- written, so that a check of the last hour reads the last hour and not the whole history.
CREATE INDEX ledger_entries_created_idx ON ledger_entries (created_at);
CREATE INDEX shardgate_credit_outbox_debited_idx ON shardgate_credit_outbox (debited_at);
