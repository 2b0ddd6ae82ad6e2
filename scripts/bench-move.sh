#!/usr/bin/env bash
# bench-move.sh: move a key range of S transfers between two shards under load, for each S.
#
#   scripts/bench-move.sh [-c CLIENTS] [-r RATE] [S ...]      (default S: 10000 100000)
#
# For each S it starts two shards on local PostgreSQL processes (internal/localpg), seeds S
# transfers into the range 40-80 of the first through the transfer functions (the rows the
# router writes: records, debits, credits in the range, and an owed credit for one in ten),
# runs CLIENTS clients (8) each posting RATE transfers a second at most (50), half into 40-80
# and half into -40, each to the shard that owns its account, and moves 40-80 to the second
# shard with the apply of `router shardmap apply`. It prints apply's progress, then the apply
# time and rows/s, and for the moving range and the other one: transfers applied during the
# move, the longest time without one, the refusals (no shard owned the range: the fence), and
# p99 latency during and before the move. Then it checks every row: each acknowledged key
# replays on its owner and has one record, one debit and its credit there, and the old owner
# keeps no row of the moved range. A run of S = 1,000,000 takes a long time on a small machine.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=8 rate=50
while getopts c:r: opt; do
	case $opt in
	c) clients=$OPTARG ;;
	r) rate=$OPTARG ;;
	*) echo "usage: $0 [-c CLIENTS] [-r RATE] [S ...]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10000 100000)
for s in "${sizes[@]}"; do
	SHARDGATE_BENCH_MOVE=$s SHARDGATE_BENCH_MOVE_CLIENTS=$clients SHARDGATE_BENCH_MOVE_RATE=$rate \
		go test ./rangemove -count=1 -run '^TestBenchMove$' -v -timeout 2h |
		grep -v -e '^=== RUN' -e '^PASS$' -e '^ok '
done
