-- The peer's tables (peer_test.go), in a schema of their own: a key table holding each key's
-- request hash and, once its transaction commits, its response; and a ledger with one row per
-- leg of a transfer, as a team writing the service by hand would have them.
CREATE SCHEMA peer;
CREATE TABLE peer.idem (
    key          text PRIMARY KEY,
    request_hash text NOT NULL,
    response     text
);
CREATE TABLE peer.ledger (
    transfer_id text   NOT NULL,
    account_id  bigint NOT NULL,
    amount      bigint NOT NULL,
    kind        text   NOT NULL,
    PRIMARY KEY (transfer_id, kind)
);
