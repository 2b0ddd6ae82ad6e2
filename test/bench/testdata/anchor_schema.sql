-- What anchor.sql writes, in a schema of its own (anchor.sql runs with search_path=anchor): an
-- unpartitioned key table with PRIMARY KEY (scope, key) and a ledger with a uuid primary key,
-- as a plain hand-written design would have them. Read by test/bench and scripts/bench-compare.sh.
CREATE SCHEMA anchor;
CREATE TABLE anchor.idem (
    key          text  NOT NULL,
    scope        text  NOT NULL,
    request_hash text  NOT NULL,
    state        text  NOT NULL,
    response     jsonb NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE TABLE anchor.ledger (
    id         uuid   PRIMARY KEY,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL,
    kind       text   NOT NULL
);
