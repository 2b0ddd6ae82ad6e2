#!/usr/bin/env bash
# Installs what shardgate's tests and `router dev` need beyond Go: PostgreSQL server binaries
# (initdb, postgres) and pgbench. Idempotent: does nothing when they are present.
set -euo pipefail

have_server() {
  [ -n "${SHARDGATE_PG_BIN:-}" ] && [ -x "$SHARDGATE_PG_BIN/initdb" ] && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

if have_server && command -v pgbench >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-deps: PostgreSQL server binaries or pgbench are missing; run as root, or: sudo apt-get install -y postgresql-15 postgresql-client-15" >&2
  exit 1
fi
echo "ensure-deps: installing postgresql-15 and postgresql-client-15 from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql-15 postgresql-client-15 >/dev/null
have_server && command -v pgbench >/dev/null
