-- pgbench script: one replay per transaction, through the statement the router sends. It picks
-- a random key that transfer_new.sql created (in round r, client c's n-th key, n up to
-- per_client: the fewest keys any client created in any round) and sends it with the same request
-- hash, so the outcome is 'replayed'. Set with -D by bench_test.go: the variables of
-- transfer_new.sql, clients, rounds (of transfer_new.sql so far) and per_client.
\set c random(0, :clients - 1)
\set r random(0, :rounds - 1)
\set n :r * 16777216 + random(1, :per_client)
\set k permute(:n, 1099511627776, :c) * 1024 + :c
\set src random(1, 1000000)
\set dst :src + 1
\set keyspace hash(:src)
\set amount random(1, 100000)
SELECT outcome, stored_response, shard_map_version
FROM shardgate_transfer(:scope, lpad(:k, 26, '0'), :request_hash, :keyspace, lpad(:k, 48, '0'), :client, :src, :dst, :amount, :currency, NULL, :response);
