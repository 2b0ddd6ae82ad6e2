-- pgbench script: the anchor, the plain one-statement CTE a hand-written service would send for
-- one new transfer: claim the key, write the debit, one implicit transaction and one commit. It
-- writes the unpartitioned tables of bench_test's anchorTables (schema anchor, set as the
-- search_path by the benchmark); each transaction adds one row to idem and one to ledger.
\set acct random(1, 1000000)
\set amt random(1, 100000)
WITH c AS (INSERT INTO idem (key, scope, request_hash, state, response)
           VALUES (gen_random_uuid()::text, 'transfer', 'h', 'completed', '{"status":201}')
           ON CONFLICT (scope, key) DO NOTHING RETURNING key),
     e AS (INSERT INTO ledger (id, account_id, amount, kind)
           SELECT gen_random_uuid(), :acct, :amt, 'transfer_out' FROM c RETURNING id)
SELECT count(*) FROM e;
