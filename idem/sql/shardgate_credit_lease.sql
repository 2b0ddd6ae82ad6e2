-- shardgate_credit_lease() is the lease an owed credit is written with when its debit applies.
-- A router whose relay delivers the credits of its own debits at once (relay's handoff) says so
-- in two settings of each of its connections, set when the connection opens
-- (idem.CreditLeaseSettings): shardgate.credit_lease_owner, its relay's name in leases, and
-- shardgate.credit_lease, for how long (an interval). The owed row is then leased to that relay
-- from its first instant, in the debit's own transaction: no relay claims it while the router
-- delivers it, and the claim's commit is saved. Should the router die first, the lease runs out
-- and any relay's poll claims the row as it claims any other. A connection without the settings
-- (a router of an earlier release, one whose relay is off, a command) writes the row unleased and
-- due at once. owner and until are NULL then.
CREATE OR REPLACE FUNCTION shardgate_credit_lease(OUT owner text, OUT until timestamptz)
LANGUAGE sql STABLE
AS $fn$
    SELECT o, CASE WHEN o IS NOT NULL THEN now() + nullif(current_setting('shardgate.credit_lease', true), '')::interval END
      FROM nullif(current_setting('shardgate.credit_lease_owner', true), '') AS o
$fn$;
