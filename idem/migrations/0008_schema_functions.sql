-- 0008: functions are no longer defined by versioned migrations. Each lives in one file under
-- idem/sql/, and migrate applies those files (CREATE OR REPLACE) in one transaction after the
-- versioned migrations, under the same lock, whenever a file's text differs from the checksum
-- recorded here. A shard migrated by an earlier release already has every function; migrate
-- replaces each once with the same body from its file and records it.
CREATE TABLE shardgate_schema_functions (
    name       text        PRIMARY KEY, -- the file under idem/sql/, e.g. shardgate_apply_batch.sql
    checksum   text        NOT NULL,    -- sha256 of the file's text, hex
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Nothing has called shardgate_prior_outcome since the transfer functions became wrappers over
-- shardgate_apply_rows and shardgate_apply_batch (0004), and no file defines it.
DROP FUNCTION IF EXISTS shardgate_prior_outcome(text, text, text, text);
