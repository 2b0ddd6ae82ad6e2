-- Whether a group's arrays are unusable: one is not n items long, or a kind is neither leg. A
-- plain SQL expression, which the planner inlines into the caller's: no query of its own.
CREATE OR REPLACE FUNCTION shardgate_group_args_invalid(n integer, kinds text[], VARIADIC lengths integer[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT coalesce(NOT (n = ALL (lengths)), true)
        OR NOT coalesce(kinds <@ ARRAY['transfer_out', 'transfer_in']::text[], false)
$fn$;
