#!/usr/bin/env bash
# bench-move.sh: move a key range of S transfers between two shards under load, for each S.
#
#   scripts/bench-move.sh [-c CLIENTS] [-r RATE] [-p PACE] [-s 1|2] [S ...]      (default S: 10000 100000)
#
# For each S it starts two shards, each a local PostgreSQL server of its own (internal/localpg)
# with fsync on, as shards on separate machines are; seeds S transfers into the range 40-80 of the
# first through the transfer functions (the rows a router writes: records, debits, credits in the
# range, and an owed credit for one in ten); and starts a router (buffering at its defaults) over
# the two shards, serving HTTP from a map file (after a VACUUM ANALYZE of both shards and a
# CHECKPOINT of both servers, so the seed's aftermath is not measured). CLIENTS clients (8) each
# post at most RATE transfers a second (50) to the router, half from accounts of 40-80 and half
# from -40, each retrying a 503 after 50 ms with the same key, while 40-80 moves to the second
# shard with `router shardmap apply --map`, run as a process of its own as an operator runs it
# (the new map file is put in place once the range is fenced), paced at PACE
# (rangemove.DefaultPace unless -p). It prints apply's output, then the apply time and rows/s,
# and for the moving range and the other one: 201s during the move, the longest time without one,
# the answers that were not 201, p99 latency (first send to 201) during the move and in the 30 s
# before it, their ratio, p99 up to the grant and during the purge; the servers' checkpoints and
# WAL up to the grant and in the purge; what the shards' backends were doing before and during
# the move (sampled every 100 ms); and how the router's holdings ended. Then it checks every row:
# each acknowledged key (and one seeded key in a hundred) replays through a new router, byte for
# byte; each record has one debit and its credit on its shard; the old owner keeps no row of the
# moved range. A run of S = 1,000,000 takes about seven minutes on a small machine.
#
# The servers get shared_buffers=1GB rather than the tests' 32MB, as a shard holding millions of
# rows would be sized: SHARDGATE_PG_SETTINGS (space-separated name=value pairs) overrides it.
# -s 1 puts both shards on one server instead (two databases of the tests' server, fsync off,
# sharing WAL, buffers and checkpoints), as the earlier figures in docs/operations.md were taken;
# SHARDGATE_BENCH_MOVE_FSYNC=off turns fsync off on the servers of their own.
#
# Experiments, to tell what a move costs the other ranges from what the machine does: before the
# move, SHARDGATE_BENCH_MOVE_CAPTURE=30s lists it with nothing copied (its change capture alone)
# and SHARDGATE_BENCH_MOVE_BURN=30s runs a busy loop at nice 19 (no move at all), each printing
# the other range's p99 then against just before; SHARDGATE_BENCH_MOVE_NICE=19 runs the apply and
# its shards' backends at that nice value.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=8 rate=50 pace= servers=2
while getopts c:r:p:s: opt; do
	case $opt in
	c) clients=$OPTARG ;;
	r) rate=$OPTARG ;;
	p) pace=$OPTARG ;;
	s) servers=$OPTARG ;;
	*) echo "usage: $0 [-c CLIENTS] [-r RATE] [-p PACE] [-s 1|2] [S ...]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10000 100000)
export SHARDGATE_PG_SETTINGS=${SHARDGATE_PG_SETTINGS-shared_buffers=1GB}
for s in "${sizes[@]}"; do
	SHARDGATE_BENCH_MOVE=$s SHARDGATE_BENCH_MOVE_CLIENTS=$clients SHARDGATE_BENCH_MOVE_RATE=$rate SHARDGATE_BENCH_MOVE_PACE=$pace SHARDGATE_BENCH_MOVE_SERVERS=$servers \
		go test ./rangemove -count=1 -run '^TestBenchMove$' -v -timeout 2h |
		grep --line-buffered -v -e '^=== RUN' -e '^PASS$' -e '^ok '
done
