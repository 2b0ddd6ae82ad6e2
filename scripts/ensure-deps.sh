#!/usr/bin/env bash
# Installs what shardgate's tests and `router dev` need beyond Go, from Debian's packages:
# PostgreSQL server binaries (initdb, postgres), pgbench, and promtool (checks the alert rules).
# Idempotent: does nothing when they are present.
set -euo pipefail

have_server() {
  [ -n "${SHARDGATE_PG_BIN:-}" ] && [ -x "$SHARDGATE_PG_BIN/initdb" ] && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()
have_server || missing+=(postgresql-15)
command -v pgbench >/dev/null || missing+=(postgresql-client-15)
command -v promtool >/dev/null || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "ensure-deps: missing ${missing[*]}; run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "ensure-deps: installing ${missing[*]} from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged services; shardgate runs its own servers, so stop them again.
if command -v service >/dev/null; then
  service prometheus stop >/dev/null 2>&1 || true
fi
have_server && command -v pgbench >/dev/null && command -v promtool >/dev/null
