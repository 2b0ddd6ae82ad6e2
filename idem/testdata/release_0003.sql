-- A shard as the release with migrations 0001-0003 left it: pg_dump of a database that ran
-- idem/migrations 0001-0003 of revision 7256034. A fixture of a past release for the upgrade tests, not a
-- definition. Written by scripts/release-fixtures.sh; do not edit.
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: shardgate_copy_records(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_copy_records(OUT inserted bigint, OUT conflicts bigint) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    m record;
    held_hash text;
BEGIN
    inserted := 0;
    conflicts := 0;
    FOR m IN SELECT * FROM moving_rows ORDER BY scope, key LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(m.scope || E'\n' || m.key, 1));
        SELECT r.request_hash INTO held_hash
          FROM idempotency_record r WHERE r.scope = m.scope AND r.key = m.key LIMIT 1;
        IF NOT FOUND THEN
            INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state, created_at)
            VALUES (m.key, m.scope, m.request_hash, m.keyspace_id, m.response, m.state, m.created_at);
            inserted := inserted + 1;
        ELSIF held_hash IS DISTINCT FROM m.request_hash THEN
            conflicts := conflicts + 1;
        END IF;
    END LOOP;
END
$$;


--
-- Name: shardgate_prior_outcome(text, text, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_prior_outcome(p_scope text, p_key text, p_request_hash text, p_if_absent text, OUT outcome text, OUT stored_response jsonb) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    r record;
BEGIN
    SELECT ir.request_hash, ir.state, ir.response INTO r
      FROM idempotency_record ir
     WHERE ir.scope = p_scope AND ir.key = p_key;
    IF NOT FOUND THEN
        outcome := p_if_absent;
    ELSIF r.request_hash <> p_request_hash THEN
        outcome := 'key_reused';
    ELSIF r.state = 'completed' THEN
        outcome := 'replayed';
        stored_response := r.response;
    ELSE
        outcome := 'in_progress';
    END IF;
END
$$;


--
-- Name: shardgate_transfer(text, text, text, bigint, text, text, bigint, bigint, bigint, text, text, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer(p_scope text, p_key text, p_request_hash text, p_keyspace bigint, p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint, p_currency text, p_reference text, p_response jsonb, OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint) RETURNS record
    LANGUAGE plpgsql
    SET lock_timeout TO '10s'
    AS $$
BEGIN
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range
                    WHERE active AND lo <= p_keyspace AND (hi IS NULL OR p_keyspace < hi)) THEN
        outcome := 'not_owner';
        SELECT s.map_version INTO shard_map_version FROM shardgate_shard s;
        RETURN;
    END IF;

    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key || E'\n' || p_request_hash, 2)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'in_progress') po;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key, 1)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'key_reused') po;
        RETURN;
    END IF;
    SELECT po.outcome, po.stored_response INTO outcome, stored_response
      FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, NULL) po;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;

    INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
    VALUES (p_transfer_id, p_keyspace, p_src, p_dst, p_amount, p_currency, 'transfer_out', p_reference, p_client)
    ON CONFLICT (transfer_id, kind) DO NOTHING;
    IF NOT FOUND THEN
        outcome := 'expired';
        RETURN;
    END IF;
    -- Raises 23514 (no partition of relation ... found for row) when upkeep has not created the
    -- partition for now(); the whole statement, debit included, then rolls back.
    INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
    VALUES (p_key, p_scope, p_request_hash, p_keyspace, p_response, 'completed');
    outcome := 'applied';
END
$$;


--
-- Name: shardgate_transfer(text, text, text, bigint, text, text, bigint, bigint, bigint, text, text, jsonb, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer(p_scope text, p_key text, p_request_hash text, p_keyspace bigint, p_transfer_id text, p_client text, p_src bigint, p_dst bigint, p_amount bigint, p_currency text, p_reference text, p_response jsonb, p_retention interval, OUT outcome text, OUT stored_response jsonb, OUT shard_map_version bigint) RETURNS record
    LANGUAGE plpgsql
    SET lock_timeout TO '10s'
    AS $$
BEGIN
    -- Shared with every transfer, exclusive for an ownership change (idem.ApplyOwnership), so a
    -- range is never revoked under a transfer that already checked it.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range
                    WHERE active AND lo <= p_keyspace AND (hi IS NULL OR p_keyspace < hi)) THEN
        outcome := 'not_owner';
        SELECT s.map_version INTO shard_map_version FROM shardgate_shard s;
        RETURN;
    END IF;

    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key || E'\n' || p_request_hash, 2)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'in_progress') po;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || E'\n' || p_key, 1)) THEN
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, 'key_reused') po;
        RETURN;
    END IF;
    SELECT po.outcome, po.stored_response INTO outcome, stored_response
      FROM shardgate_prior_outcome(p_scope, p_key, p_request_hash, NULL) po;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;

    INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
    VALUES (p_transfer_id, p_keyspace, p_src, p_dst, p_amount, p_currency, 'transfer_out', p_reference, p_client)
    ON CONFLICT (transfer_id, kind) DO NOTHING;
    IF NOT FOUND THEN
        -- The transfer is in the ledger and its record is not to be found. Only retention may
        -- have dropped the record, and only once the debit itself is older than retention: a
        -- younger debit without its record means the record's partition is unreadable (detached
        -- by hand, say). Answering "expired" then would be final to the client for a transfer
        -- whose stored response exists, so the router fails closed with a retryable error.
        IF EXISTS (SELECT 1 FROM ledger_entries
                    WHERE transfer_id = p_transfer_id AND kind = 'transfer_out'
                      AND created_at < statement_timestamp() - p_retention) THEN
            outcome := 'expired';
        ELSE
            outcome := 'record_missing';
        END IF;
        RETURN;
    END IF;
    -- Raises 23514 (no partition of relation ... found for row) when upkeep has not created the
    -- partition for now(); the whole statement, debit included, then rolls back.
    INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
    VALUES (p_key, p_scope, p_request_hash, p_keyspace, p_response, 'completed');
    outcome := 'applied';
END
$$;


--
-- Name: shardgate_transfer_batch(text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], bigint[], text[], text[], jsonb[], interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.shardgate_transfer_batch(p_scopes text[], p_keys text[], p_request_hashes text[], p_keyspaces bigint[], p_transfer_ids text[], p_clients text[], p_srcs bigint[], p_dsts bigint[], p_amounts bigint[], p_currencies text[], p_references text[], p_responses jsonb[], p_retention interval) RETURNS TABLE(idx integer, outcome text, stored_response jsonb, shard_map_version bigint)
    LANGUAGE plpgsql
    SET lock_timeout TO '10s'
    AS $$
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    claimed text[] := '{}';   -- scope || E'\n' || key of the items this call claimed
    claimed_hash text[] := '{}';
    map_version bigint;
    ident text;
    pos integer;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF array_length(p_scopes, 1) IS DISTINCT FROM n OR array_length(p_request_hashes, 1) IS DISTINCT FROM n
       OR array_length(p_keyspaces, 1) IS DISTINCT FROM n OR array_length(p_transfer_ids, 1) IS DISTINCT FROM n
       OR array_length(p_clients, 1) IS DISTINCT FROM n OR array_length(p_srcs, 1) IS DISTINCT FROM n
       OR array_length(p_dsts, 1) IS DISTINCT FROM n OR array_length(p_amounts, 1) IS DISTINCT FROM n
       OR array_length(p_currencies, 1) IS DISTINCT FROM n OR array_length(p_references, 1) IS DISTINCT FROM n
       OR array_length(p_responses, 1) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'shardgate_transfer_batch: the item arrays differ in length' USING ERRCODE = '22023';
    END IF;
    -- Shared with every transfer, exclusive for an ownership change: taken once for the group.
    PERFORM pg_advisory_xact_lock_shared(21319, 1);
    SELECT s.map_version INTO map_version FROM shardgate_shard s;

    FOR i IN 1 .. n LOOP
        idx := i;
        outcome := NULL;
        stored_response := NULL;
        shard_map_version := NULL;
        ident := p_scopes[i] || E'\n' || p_keys[i];

        IF NOT EXISTS (SELECT 1 FROM shardgate_owned_range
                        WHERE active AND lo <= p_keyspaces[i] AND (hi IS NULL OR p_keyspaces[i] < hi)) THEN
            outcome := 'not_owner';
            shard_map_version := map_version;
            RETURN NEXT;
            CONTINUE;
        END IF;

        pos := array_position(claimed, ident);
        IF pos IS NOT NULL THEN
            -- Claimed by an earlier item of this group, not committed yet: in flight.
            outcome := CASE WHEN claimed_hash[pos] = p_request_hashes[i] THEN 'in_progress' ELSE 'key_reused' END;
            RETURN NEXT;
            CONTINUE;
        END IF;

        IF NOT pg_try_advisory_xact_lock(hashtextextended(ident || E'\n' || p_request_hashes[i], 2)) THEN
            SELECT po.outcome, po.stored_response INTO outcome, stored_response
              FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], 'in_progress') po;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF NOT pg_try_advisory_xact_lock(hashtextextended(ident, 1)) THEN
            SELECT po.outcome, po.stored_response INTO outcome, stored_response
              FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], 'key_reused') po;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT po.outcome, po.stored_response INTO outcome, stored_response
          FROM shardgate_prior_outcome(p_scopes[i], p_keys[i], p_request_hashes[i], NULL) po;
        IF outcome IS NOT NULL THEN
            RETURN NEXT;
            CONTINUE;
        END IF;

        INSERT INTO ledger_entries (transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client)
        VALUES (p_transfer_ids[i], p_keyspaces[i], p_srcs[i], p_dsts[i], p_amounts[i], p_currencies[i], 'transfer_out', p_references[i], p_clients[i])
        ON CONFLICT (transfer_id, kind) DO NOTHING;
        IF NOT FOUND THEN
            -- As in 0002: expired only for a debit older than retention.
            IF EXISTS (SELECT 1 FROM ledger_entries
                        WHERE transfer_id = p_transfer_ids[i] AND kind = 'transfer_out'
                          AND created_at < statement_timestamp() - p_retention) THEN
                outcome := 'expired';
            ELSE
                outcome := 'record_missing';
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
        VALUES (p_keys[i], p_scopes[i], p_request_hashes[i], p_keyspaces[i], p_responses[i], 'completed');
        claimed := claimed || ident;
        claimed_hash := claimed_hash || p_request_hashes[i];
        outcome := 'applied';
        RETURN NEXT;
    END LOOP;
END
$$;


SET default_tablespace = '';

--
-- Name: idempotency_record; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.idempotency_record (
    key text NOT NULL,
    scope text NOT NULL,
    request_hash text NOT NULL,
    keyspace_id bigint NOT NULL,
    response jsonb,
    state text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT idempotency_record_check CHECK (((state = 'in_progress'::text) OR (response IS NOT NULL))),
    CONSTRAINT idempotency_record_key_check CHECK (((length(key) >= 1) AND (length(key) <= 255))),
    CONSTRAINT idempotency_record_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'completed'::text])))
)
PARTITION BY RANGE (created_at);


SET default_table_access_method = heap;

--
-- Name: ledger_entries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger_entries (
    id bigint NOT NULL,
    transfer_id text NOT NULL,
    keyspace_id bigint NOT NULL,
    account_id bigint NOT NULL,
    counterparty_id bigint NOT NULL,
    amount bigint NOT NULL,
    currency text NOT NULL,
    kind text NOT NULL,
    reference text,
    client text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ledger_entries_amount_check CHECK ((amount > 0)),
    CONSTRAINT ledger_entries_currency_check CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT ledger_entries_kind_check CHECK ((kind = ANY (ARRAY['transfer_out'::text, 'transfer_in'::text])))
);


--
-- Name: ledger_entries_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.ledger_entries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.ledger_entries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: shardgate_owned_range; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_owned_range (
    key_range text NOT NULL,
    lo bigint NOT NULL,
    hi bigint,
    active boolean DEFAULT true NOT NULL,
    copied boolean DEFAULT false NOT NULL,
    CONSTRAINT shardgate_owned_range_check CHECK ((NOT (active AND copied))),
    CONSTRAINT shardgate_owned_range_check1 CHECK (((hi IS NULL) OR (lo < hi)))
);


--
-- Name: shardgate_schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: shardgate_shard; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.shardgate_shard (
    singleton boolean DEFAULT true NOT NULL,
    shard_name text NOT NULL,
    map_version bigint NOT NULL,
    applying_version bigint DEFAULT 0 NOT NULL,
    applying_digest text DEFAULT ''::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT shardgate_shard_map_version_check CHECK ((map_version >= 0)),
    CONSTRAINT shardgate_shard_singleton_check CHECK (singleton)
);


--
-- Data for Name: ledger_entries; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: shardgate_owned_range; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: shardgate_schema_migrations; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.shardgate_schema_migrations VALUES (1, 'transfers', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (2, 'expired_needs_old_debit', '2026-01-01 00:00:00+00');
INSERT INTO public.shardgate_schema_migrations VALUES (3, 'transfer_batch', '2026-01-01 00:00:00+00');


--
-- Data for Name: shardgate_shard; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Name: ledger_entries_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.ledger_entries_id_seq', 1, false);


--
-- Name: ledger_entries ledger_entries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_entries
    ADD CONSTRAINT ledger_entries_pkey PRIMARY KEY (id);


--
-- Name: ledger_entries ledger_entries_transfer_kind_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger_entries
    ADD CONSTRAINT ledger_entries_transfer_kind_key UNIQUE (transfer_id, kind);


--
-- Name: shardgate_owned_range shardgate_owned_range_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_owned_range
    ADD CONSTRAINT shardgate_owned_range_pkey PRIMARY KEY (key_range);


--
-- Name: shardgate_schema_migrations shardgate_schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_schema_migrations
    ADD CONSTRAINT shardgate_schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: shardgate_shard shardgate_shard_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.shardgate_shard
    ADD CONSTRAINT shardgate_shard_pkey PRIMARY KEY (singleton);


--
-- Name: ledger_entries_account_created_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ledger_entries_account_created_idx ON public.ledger_entries USING btree (account_id, created_at);


--
-- PostgreSQL database dump complete
--


