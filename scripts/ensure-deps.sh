#!/usr/bin/env bash
# Installs what shardgate needs beyond Go, from Debian's packages. `ensure-deps.sh run` (for
# `make run`): the PostgreSQL server binaries (initdb, postgres) and nothing else.
# `ensure-deps.sh` or `ensure-deps.sh test` (for the tests): also pgbench and promtool (checks
# the alert rules). `ensure-deps.sh compare` (for scripts/bench-compare.sh): the server binaries,
# pgbench and wrk. Idempotent: does nothing when they are present.
set -euo pipefail

have_server() {
  [ -n "${SHARDGATE_PG_BIN:-}" ] && [ -x "$SHARDGATE_PG_BIN/initdb" ] && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

purpose="${1:-test}"
case "$purpose" in run|test|compare) ;; *) echo "usage: ensure-deps.sh [run|test|compare]" >&2; exit 2 ;; esac
missing=()
have_server || missing+=(postgresql-15)
if [ "$purpose" != run ]; then
  command -v pgbench >/dev/null || missing+=(postgresql-client-15)
fi
if [ "$purpose" = test ]; then
  command -v promtool >/dev/null || missing+=(prometheus)
fi
if [ "$purpose" = compare ]; then
  command -v wrk >/dev/null || missing+=(wrk)
fi
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
have_server
case "$purpose" in
  test) command -v pgbench >/dev/null && command -v promtool >/dev/null ;;
  compare) command -v pgbench >/dev/null && command -v wrk >/dev/null ;;
esac
