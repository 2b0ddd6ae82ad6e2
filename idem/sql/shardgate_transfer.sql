-- requires: shardgate_apply_batch shardgate_apply_rows
--
-- The transfer functions of earlier releases, kept as wrappers so that their routers keep
-- working during a rolling upgrade: one body (shardgate_apply_batch, shardgate_apply_rows), and
-- a debit through any of them records its owed credit. The router of this release calls
-- neither.
--   shardgate_transfer_batch   a group of debits as parallel arrays
--   shardgate_transfer(13)     one debit, with the retention that tells expired from
--                              record_missing
--   shardgate_transfer(12)     one debit, without retention: any debit without its record is
--                              expired (a retention of zero)
CREATE OR REPLACE FUNCTION shardgate_transfer_batch(
    p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[],
    p_transfer_ids text[], p_clients text[], p_srcs bigint[], p_dsts bigint[], p_amounts bigint[],
    p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval)
RETURNS TABLE (idx integer, outcome text, stored_response jsonb, shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT b.idx, b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_batch(
           array_fill('transfer_out'::text, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_scopes, p_keys, p_request_hashes, p_keyspaces, p_transfer_ids, p_clients, p_srcs, p_dsts,
           array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_keys, 1), 0)]),
           p_amounts, p_currencies, p_references, p_responses, p_retention) b
$fn$;

CREATE OR REPLACE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb, p_retention interval,
    OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT b.outcome, b.stored_response, b.shard_map_version
      FROM shardgate_apply_rows(ARRAY['transfer_out'], ARRAY[p_scope], ARRAY[p_key], ARRAY[p_request_hash],
           ARRAY[p_keyspace], ARRAY[p_transfer_id], ARRAY[p_client], ARRAY[p_src], ARRAY[p_dst], ARRAY[NULL::bigint],
           ARRAY[p_amount], ARRAY[p_currency], ARRAY[p_reference], ARRAY[p_response], p_retention) b
$fn$;

CREATE OR REPLACE FUNCTION shardgate_transfer(
    p_scope text, p_key text, p_request_hash text, p_keyspace bigint,
    p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint,
    p_currency text, p_reference text, p_response jsonb,
    OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint)
LANGUAGE sql
AS $fn$
    SELECT t.outcome, t.stored_response, t.shard_map_version
      FROM shardgate_transfer(p_scope, p_key, p_request_hash, p_keyspace, p_transfer_id, p_client,
           p_src, p_dst, p_amount, p_currency, p_reference, p_response, interval '0') t
$fn$;
