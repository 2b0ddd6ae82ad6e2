-- shardgate_key_floor(key) is the time a UUIDv7 key in canonical form was made (what router's
-- keyTime reads), and NULL for any other key. No record is dated before its key's floor: the
-- CHECK idempotency_record_not_before_key_floor spells the same rule out (calling this function
-- there would cost every insert a parse of its body), and idem's TestKeyFloorAndTheRuleAgree
-- holds the two spellings together.
CREATE OR REPLACE FUNCTION shardgate_key_floor(key text)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT CASE WHEN key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$'
                THEN to_timestamp(('x' || substr(key, 1, 8) || substr(key, 10, 4))::bit(48)::bigint / 1000.0) END
$fn$;
