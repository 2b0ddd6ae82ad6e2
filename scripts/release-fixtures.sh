#!/usr/bin/env bash
# Writes idem/testdata/release_NNNN.sql: shards as past releases left them (pg_dump of a database
# migrated by that release's migrations, which still defined the SQL functions), for the upgrade
# tests. They are fixtures of past releases, not definitions. REV is the revision whose
# migrations are replayed; 7256034 is the last release with function bodies in migrations.
# Usage: scripts/release-fixtures.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/../idem"
SHARDGATE_WRITE_RELEASE_FIXTURES="${1:-7256034}" go test -count=1 -run '^TestWriteReleaseFixtures$' .
