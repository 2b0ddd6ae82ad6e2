-- pgbench script: one new transfer per transaction, through the statement the router sends
-- (idem.Transfer: SELECT ... FROM shardgate_apply_rows(...), migration 0004, with arrays of one
-- item), with the router's argument shapes. The one bench shard owns the whole keyspace, so dst
-- is on the debit's shard and the credit is written in the same transaction, as the router's is. Set with -D by
-- the benchmark: scope, client, request_hash, currency, response (a response the router stored,
-- so the same size), retention (the router's configured one, as an interval) and n: the number
-- of this script's earlier runs times 16777216 (runStride), where this run's count starts.
--
-- n counts this client's transfers. The key is a pseudorandom permutation of (client, n), so that
-- keys and transfer ids land all over their indexes as the router's random keys do, and no two
-- runs make the same key. Key (26 digits, the length of the load generator's keys) and transfer
-- id (48 hex digits) are padded on the server: lpad is the only work pgbench asks of PostgreSQL
-- that the router does not.
\set n :n + 1
\set k permute(:n, 1099511627776, :client_id) * 1024 + :client_id
\set src random(1, 1000000)
\set dst :src + 1
\set keyspace hash(:src)
\set dstkeyspace hash(:dst)
\set amount random(1, 100000)
SELECT idx, outcome, stored_response, shard_map_version, credit_settled
FROM shardgate_apply_rows(ARRAY['transfer_out'], ARRAY[:scope], ARRAY[lpad(:k, 26, '0')], ARRAY[:request_hash], ARRAY[:keyspace::bigint],
     ARRAY[lpad(:k, 48, '0')], ARRAY[:client], ARRAY[:src::bigint], ARRAY[:dst::bigint], ARRAY[:dstkeyspace::bigint],
     ARRAY[:amount::bigint], ARRAY[:currency], ARRAY[NULL::text], ARRAY[:response::jsonb], :retention);
