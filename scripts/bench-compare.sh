#!/usr/bin/env bash
# bench-compare.sh: the router at two revisions side by side, new keys under wrk (a load
# generator in its own process), with the anchor CTE under pgbench between
# them, all on one durable PostgreSQL (fsync and synchronous_commit on) started for the run.
#
#   scripts/bench-compare.sh [-r ROUNDS] [-d SECONDS] [-c 1,8,64] [-a DAYS] [-B YAML] [-H YAML] BASE [HEAD]
#
# BASE and HEAD are git revisions; HEAD defaults to the working tree. -B and -H add YAML (flow
# style fits one line, e.g. -H 'group_commit: {in_flight: 2}') to the base's or the head's
# router.yaml, so that one revision can be compared with itself under two settings; an auth or
# shard_pool section given so replaces the script's (auth mode none, 64 connections).
#
# -a DAYS starts each router's database as one that has run DAYS days at daily partitions: an
# (empty) idempotency_record partition for each of them, and, for a release with migration 0006,
# every record taken to be under its key-floor rule. A fresh database has four partitions; the
# default retention keeps about 34. Empty partitions understate the lookup's cost a little (their
# indexes are a single page).
#
# Each round runs, for each concurrency, both routers (in alternating order from round to
# round, so that a machine that slows down or speeds up does not favour one side) and then the
# anchor. The machine is noisy:
# read the ranges over rounds and the pair-by-pair ratios, not one run. Every answer must be a
# new 201 or a 503 (a router shedding load: counted and shown, since throughput bought by
# refusing work is no throughput), and at the end each side's ledger must hold a debit for every
# 201 it gave, and at most one more for each request a run's end cut off (one per connection) and
# each 503 (a 503 whose COMMIT outcome was unknown may have committed: a retry would replay it).
#
# Needs PostgreSQL's server binaries, pgbench and wrk (installed from Debian when run as root:
# scripts/ensure-deps.sh compare). Ports: SHARDGATE_COMPARE_PORT (default 25490) for
# PostgreSQL and the next two for the routers: below Linux's ephemeral range (32768-60999), where
# a connection of one router to PostgreSQL could hold the other router's port.
set -euo pipefail

rounds=3 duration=10 concurrency=1,8,64 aged=0 base_conf='' head_conf=''
usage() { echo "usage: scripts/bench-compare.sh [-r ROUNDS] [-d SECONDS] [-c 1,8,64] [-a DAYS] [-B YAML] [-H YAML] BASE [HEAD]" >&2; exit 2; }
while getopts r:d:c:a:B:H: opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    d) duration=$OPTARG ;;
    c) concurrency=$OPTARG ;;
    a) aged=$OPTARG ;;
    B) base_conf=$OPTARG ;;
    H) head_conf=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] && [ $# -le 2 ] || usage
[[ $rounds =~ ^[1-9][0-9]*$ && $duration =~ ^[1-9][0-9]*$ && $aged =~ ^[0-9]+$ && $concurrency =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || usage
if printf '%s\n%s\n' "$base_conf" "$head_conf" | grep -Eq '^(listen|shardmap):'; then
  echo "bench-compare: -B and -H may not set listen or shardmap (the script's)" >&2
  exit 2
fi

repo=$(git rev-parse --show-toplevel)
cd "$repo"
"$repo/scripts/ensure-deps.sh" compare
revision() { git rev-parse --quiet --verify --short --end-of-options "$1^{commit}" || { echo "bench-compare: $1 is not a revision" >&2; exit 2; }; }
base_rev=$(revision "$1")
head_rev=worktree
[ $# -eq 1 ] || head_rev=$(revision "$2")

pg_bin=${SHARDGATE_PG_BIN:-}
[ -n "$pg_bin" ] || pg_bin=$(pg_config --bindir 2>/dev/null || true)
if [ -n "${SHARDGATE_PG_BIN:-}" ] && [ ! -x "$pg_bin/initdb" ]; then
  echo "bench-compare: SHARDGATE_PG_BIN=$pg_bin has no initdb" >&2
  exit 2
fi
[ -x "$pg_bin/initdb" ] || pg_bin=$(dirname "$(compgen -G '/usr/lib/postgresql/*/bin/initdb' | sort -V | tail -1)")
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "bench-compare: as root, PostgreSQL runs as the postgres user, and there is none: run as another user" >&2
  exit 2
fi
port=${SHARDGATE_COMPARE_PORT:-25490}
# Connections: each router's pool (64), pgbench's clients, and some to spare.
max_c=$(tr , '\n' <<<"$concurrency" | sort -n | tail -1)
tmp=$(mktemp -d /tmp/shardgate-compare.XXXXXX)
chmod 755 "$tmp"
routers=() child=

# as_pg runs a command as the postgres user when this script runs as root (PostgreSQL refuses
# to run as root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# cleanup runs on every exit: it must get to the end whatever fails on the way.
cleanup() {
  set +e
  local pid
  [ -n "$child" ] && kill "$child" 2>/dev/null
  for pid in ${routers[@]+"${routers[@]}"}; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    pid=
    for pid in ${routers[@]+"${routers[@]}"}; do kill -0 "$pid" 2>/dev/null && break; pid=; done
    [ -z "$pid" ] && break
    sleep 0.1
  done
  for pid in ${routers[@]+"${routers[@]}"}; do kill -9 "$pid" 2>/dev/null; done
  [ -f "$tmp/pg/postmaster.pid" ] && as_pg "$pg_bin/pg_ctl" -D "$tmp/pg" -m immediate stop >/dev/null 2>&1
  for src in "$tmp"/src-*; do [ -d "$src" ] && git worktree remove --force "$src" 2>/dev/null; done
  git worktree prune 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# build REV NAME builds the router at REV (or the working tree) as $tmp/NAME.
build() {
  local src=$repo
  if [ "$1" != worktree ]; then
    src=$tmp/src-$2
    git worktree add --detach --quiet "$src" "$1"
  fi
  (cd "$src" && go build -o "$tmp/$2" ./cmd/router)
}
build "$base_rev" base
build "$head_rev" head

mkdir -p "$tmp/pg" "$tmp/sock"
[ "$(id -u)" = 0 ] && chown postgres "$tmp/pg" "$tmp/sock"
as_pg "$pg_bin/initdb" -D "$tmp/pg" -U postgres --auth=trust >/dev/null
as_pg "$pg_bin/pg_ctl" -D "$tmp/pg" -l "$tmp/pg/server.log" -w -o "-p $port -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories=$tmp/sock -c max_connections=$((2 * 64 + max_c + 20)) -c shared_buffers=128MB -c fsync=on \
  -c synchronous_commit=on" start >/dev/null || {
  echo "bench-compare: PostgreSQL did not start on port $port (SHARDGATE_COMPARE_PORT); its log:" >&2
  tail -5 "$tmp/pg/server.log" >&2
  exit 1
}
psql() { command psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }

# age NAME: the database NAME as one that has run $aged days (-a).
age() {
  psql -d "$1" <<SQL
DO \$\$
DECLARE
    d date;
    name text;
BEGIN
    FOR i IN 1 .. $aged LOOP
        d := (now() AT TIME ZONE 'UTC')::date - i;
        name := 'idempotency_record_' || to_char(d, 'YYYY_MM_DD');
        EXECUTE format('CREATE TABLE %I (LIKE idempotency_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I UNIQUE (scope, key)', name, name || '_scope_key');
        EXECUTE format('ALTER TABLE idempotency_record ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       name, d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
    IF to_regclass('shardgate_record_floor') IS NOT NULL THEN
        UPDATE shardgate_record_floor SET unchecked_before = now() - make_interval(days => $aged + 1);
    END IF;
END
\$\$;
SQL
}

# prepare NAME PORT [YAML]: a database for the router NAME, its shard map (one shard, the whole
# keyspace) and router.yaml, migrated by that router; then serve it. YAML is added to
# router.yaml and replaces the script's auth or shard_pool section when it sets one (listen and
# shardmap are the script's).
prepare() {
  local dir=$tmp/$1-conf extra=${3:-} pid
  mkdir -p "$dir"
  psql -c "CREATE DATABASE $1"
  printf 'version: 1\nshards:\n  - name: shard-0\n    dsn: postgres://postgres@127.0.0.1:%s/%s\n    ranges: ["-"]\n' "$port" "$1" >"$dir/shardmap.yaml"
  {
    printf 'listen: 127.0.0.1:%s\nshardmap: shardmap.yaml\n' "$2"
    grep -q '^auth:' <<<"$extra" || printf 'auth:\n  mode: none\n'
    grep -q '^shard_pool:' <<<"$extra" || printf 'shard_pool:\n  max_conns: 64\n'
    printf '%s\n' "$extra"
  } >"$dir/router.yaml"
  "$tmp/$1" migrate --config "$dir/router.yaml" >/dev/null || {
    echo "bench-compare: the $1 router refused its configuration or could not migrate:" >&2
    cat "$dir/router.yaml" >&2
    exit 1
  }
  [ "$aged" = 0 ] || age "$1"
  (cd "$dir" && exec "$tmp/$1" serve --config router.yaml >serve.log 2>&1) &
  pid=$!
  routers+=("$pid")
  # Ready, and still running: a router that could not bind its port has exited, whatever else
  # answers there.
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    curl -sf "http://127.0.0.1:$2/readyz" >/dev/null 2>&1 && sleep 0.2 && kill -0 "$pid" 2>/dev/null && return
    sleep 0.1
  done
  echo "bench-compare: the $1 router did not become ready on port $2; its log:" >&2
  tail -5 "$dir/serve.log" >&2
  exit 1
}
prepare base $((port + 1)) "$base_conf"
prepare head $((port + 2)) "$head_conf"
psql -c "CREATE DATABASE anchor"
psql -d anchor -f "$repo/test/bench/testdata/anchor_schema.sql"

# measure CMD...: runs CMD with its output in $tmp/out, in the background so that a signal to
# this script is taken at once (bash runs a trap only once the foreground command has ended).
measure() {
  "$@" >"$tmp/out" 2>&1 &
  child=$!
  wait "$child"
}

# load NAME PORT C: one wrk run after a 2 s warm-up; appends "NAME C tps p50 p99 shed" to
# results, each part's count of new 201s to NAME.created and the slack for debits without their
# 201 (cut-off requests and 503s) to NAME.slack.
load() {
  local threads=$(($3 < 2 ? $3 : 2)) out line part
  for part in warm-up run; do
    measure wrk -t"$threads" -c"$3" -d"$([ $part = run ] && echo "$duration" || echo 2)s" --timeout 10s \
      -s "$repo/scripts/newkeys.lua" "http://127.0.0.1:$2" || true
    out=$(<"$tmp/out")
    line=$(grep '^p50_ms=' <<<"$out") || { echo "bench-compare: wrk failed on $1 ($part):"$'\n'"$out" >&2; exit 1; }
    if grep -q 'Socket errors' <<<"$out" || ! grep -q ' other=0$' <<<"$line"; then
      echo "bench-compare: $1 at c=$3 ($part) gave answers other than new 201s and 503s, or socket errors:"$'\n'"$out" >&2
      exit 1
    fi
    sed -E 's/.*created=([0-9]+).*/\1/' <<<"$line" >>"$tmp/$1.created"
    echo $(($3 + $(sed -E 's/.*shed=([0-9]+).*/\1/' <<<"$line"))) >>"$tmp/$1.slack"
  done
  # transfers/s counts the 201s only: wrk's requests/s, times the share of answers that were 201s
  awk -v name="$1" -v c="$3" -v line="$line" '/Requests\/sec/ {
    split(line, f, /[ =]/); print name, c, f[6] + f[8] ? $2 * f[6] / (f[6] + f[8]) : 0, f[2], f[4], f[8] }' <<<"$out" >>"$tmp/results"
}

# anchor C: pgbench on the anchor CTE; appends "anchor C tps - - 0" to results.
anchor() {
  local out
  measure env PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres PGOPTIONS='-c search_path=anchor' pgbench -n -c "$1" -j $(($1 < 2 ? $1 : 2)) -T "$duration" \
    -f "$repo/test/bench/testdata/anchor.sql" anchor || { echo "bench-compare: pgbench failed:"$'\n'"$(<"$tmp/out")" >&2; exit 1; }
  out=$(<"$tmp/out")
  echo "anchor $1 $(awk '/^tps/ {tps = $3} END {print tps}' <<<"$out") - - 0" >>"$tmp/results"
}

echo "bench-compare: base $base_rev${base_conf:+ ($base_conf)}, head $head_rev${head_conf:+ ($head_conf)}; $rounds rounds of ${duration}s runs at c=$concurrency" >&2
IFS=, read -r -a cs <<<"$concurrency"
for r in $(seq "$rounds"); do
  for c in "${cs[@]}"; do
    if [ $((r % 2)) = 1 ]; then
      load base $((port + 1)) "$c"; load head $((port + 2)) "$c"
    else
      load head $((port + 2)) "$c"; load base $((port + 1)) "$c"
    fi
    anchor "$c"
  done
  echo "bench-compare: round $r of $rounds done" >&2
done

# Every 201 is a debit in its side's ledger, and no debit is there without its 201 but for the
# requests a run's end cut off and the 503s.
for side in base head; do
  created=$(awk '{s += $1} END {print s}' "$tmp/$side.created") slack=$(awk '{s += $1} END {print s}' "$tmp/$side.slack")
  debits=$(psql -d "$side" -Atc "SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out'")
  if [ "$debits" -lt "$created" ] || [ "$debits" -gt $((created + slack)) ]; then
    echo "bench-compare: $side answered $created new 201s but its ledger has $debits debits" >&2
    exit 1
  fi
done

awk -v base="$base_rev${base_conf:+, $base_conf}" -v head="$head_rev${head_conf:+, $head_conf}" '
  function range(k) { return !(k in lo) ? "—" : lo[k] == hi[k] ? fmt(lo[k]) : fmt(lo[k]) "–" fmt(hi[k]) }
  function fmt(v) { return v >= 100 ? sprintf("%.0f", v) : sprintf("%.2f", v) }
  function add(k, v) { if (!(k in lo) || v < lo[k]) lo[k] = v; if (!(k in hi) || v > hi[k]) hi[k] = v }
  {
    add($1 " " $2, $3); n[$1 " " $2]++
    if ($1 != "anchor") { add($1 " p50 " $2, $4); add($1 " p99 " $2, $5); shed[$1 " " $2] += $6 }
    run[$1 " " $2 " " n[$1 " " $2]] = $3
    if (!($2 in seen)) { seen[$2] = 1; order[++cs] = $2 }
  }
  END {
    printf "| new keys, transfers/s |"; for (i = 1; i <= cs; i++) printf " c=%s |", order[i]; print ""
    printf "|---|"; for (i = 1; i <= cs; i++) printf "---|"; print ""
    printf "| router at %s (base) |", base; for (i = 1; i <= cs; i++) printf " %s |", range("base " order[i]); print ""
    printf "| router at %s (head) |", head; for (i = 1; i <= cs; i++) printf " %s |", range("head " order[i]); print ""
    printf "| anchor CTE (pgbench) |"; for (i = 1; i <= cs; i++) printf " %s |", range("anchor " order[i]); print ""
    for (i = 1; i <= cs; i++) for (j = 1; j <= n["head " order[i]]; j++) {
      c = order[i]
      if (run["base " c " " j] > 0) add("hb " c, run["head " c " " j] / run["base " c " " j])
      if (run["anchor " c " " j] > 0) add("ha " c, run["head " c " " j] / run["anchor " c " " j])
    }
    printf "| head / base, round by round |"; for (i = 1; i <= cs; i++) printf " %s× |", range("hb " order[i]); print ""
    printf "| head / anchor, round by round |"; for (i = 1; i <= cs; i++) printf " %s× |", range("ha " order[i]); print ""
    printf "| p50 / p99 ms, base |"; for (i = 1; i <= cs; i++) printf " %s / %s |", range("base p50 " order[i]), range("base p99 " order[i]); print ""
    printf "| p50 / p99 ms, head |"; for (i = 1; i <= cs; i++) printf " %s / %s |", range("head p50 " order[i]), range("head p99 " order[i]); print ""
    printf "| 503s (load shed) in the runs, base / head |"; for (i = 1; i <= cs; i++) printf " %d / %d |", shed["base " order[i]], shed["head " order[i]]; print ""
  }' "$tmp/results"
