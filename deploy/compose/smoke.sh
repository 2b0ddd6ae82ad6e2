#!/usr/bin/env bash
# Smoke test of the compose sandbox: brings it up, waits for both routers' /readyz, sends one
# transfer through router 1 and the same request through router 2, and checks that the second is
# a byte-identical replay (201, Idempotent-Replayed: true), and that /metrics and /admin/* answer
# on the admin port only. Always tears down, on success or not.
#
# Needs the images (../images/build-postgres-image.sh, ../images/build-router-image.sh), curl,
# and docker-compose. Exit status 0 means the sandbox works end to end.
set -euo pipefail
cd "$(dirname "$0")"

project="${SHARDGATE_COMPOSE_PROJECT:-shardgate-smoke-$$}"
port1="${SHARDGATE_ROUTER1_PORT:-18081}"
port2="${SHARDGATE_ROUTER2_PORT:-18082}"
admin1="${SHARDGATE_ROUTER1_ADMIN_PORT:-18091}"
admin2="${SHARDGATE_ROUTER2_ADMIN_PORT:-18092}"
token="${SHARDGATE_TOKEN:-dev-token}"
export SHARDGATE_ROUTER1_PORT="$port1" SHARDGATE_ROUTER2_PORT="$port2"
export SHARDGATE_ROUTER1_ADMIN_PORT="$admin1" SHARDGATE_ROUTER2_ADMIN_PORT="$admin2"
compose=(docker-compose -p "$project" -f docker-compose.yml)
work="$(mktemp -d)"

teardown() {
	status=$?
	if [ "$status" != 0 ]; then
		echo "smoke: FAILED; last logs:" >&2
		"${compose[@]}" logs --no-color --tail=20 >&2 || true
	fi
	"${compose[@]}" down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
	rm -rf "$work"
	exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

fail() { echo "smoke: $*" >&2; exit 1; }

for img in "${SHARDGATE_PG_IMAGE:-shardgate/postgres:15}" "${SHARDGATE_ROUTER_IMAGE:-shardgate/router:dev}"; do
	docker image inspect "$img" >/dev/null 2>&1 ||
		fail "image $img is missing; run deploy/images/build-postgres-image.sh and deploy/images/build-router-image.sh"
done

echo "smoke: starting project $project" >&2
"${compose[@]}" up -d --no-build >/dev/null 2>"$work/up.err" || { cat "$work/up.err" >&2; fail "docker-compose up failed"; }

ready() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$1/readyz"; }
deadline=$((SECONDS + ${SHARDGATE_SMOKE_TIMEOUT:-120}))
for port in "$port1" "$port2"; do
	until ready "$port"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "router on port $port not ready in time"
		sleep 1
	done
done
echo "smoke: both routers ready after ${SECONDS}s" >&2

key="smoke-$(date +%s)-$$-$RANDOM"
body='{"src": 8842, "dst": 1190, "amount": 2500}'
post() { # post PORT NAME: writes NAME.headers and NAME.body, prints the status
	curl -sS --max-time 10 -o "$work/$2.body" -D "$work/$2.headers" -w '%{http_code}' \
		-H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
		-H "Idempotency-Key: \"$key\"" --data-binary "$body" "http://127.0.0.1:$1/transfers"
}
header() { grep -i "^$1:" "$work/$2.headers" | head -1 | cut -d: -f2- | tr -d ' \r'; }

status1="$(post "$port1" first)"
[ "$status1" = 201 ] || fail "router 1: status $status1, want 201: $(cat "$work/first.body")"
[ -z "$(header Idempotent-Replayed first)" ] || fail "router 1: a new key was answered as a replay"
status2="$(post "$port2" replay)"
[ "$status2" = 201 ] || fail "router 2: status $status2, want 201 (replay): $(cat "$work/replay.body")"
[ "$(header Idempotent-Replayed replay)" = true ] || fail "router 2: no Idempotent-Replayed: true"
cmp -s "$work/first.body" "$work/replay.body" || fail "replay body differs from the first response"
[ "$(header Location first)" = "$(header Location replay)" ] || fail "replay Location differs"

# Admin endpoints: on the admin port, and not on the API port.
code() { curl -sS -o "$work/$2" --max-time 5 -w '%{http_code}' "$1"; }
[ "$(code "http://127.0.0.1:$admin1/metrics" metrics)" = 200 ] || fail "router 1: /metrics on the admin port did not answer 200"
grep -q '^shardgate_transfers_total{.*outcome="applied"' "$work/metrics" || fail "router 1: /metrics has no applied transfer"
[ "$(code "http://127.0.0.1:$admin2/admin/shardmap" shardmap)" = 200 ] || fail "router 2: /admin/shardmap on the admin port did not answer 200"
for path in /metrics /admin/shardmap; do
	c="$(code "http://127.0.0.1:$port1$path" api)"
	[ "$c" = 404 ] || fail "router 1: $path on the API port answered $c, want 404"
done

echo "smoke: OK: 201 via router 1, byte-identical replay via router 2 ($(header Location first)); admin endpoints only on the admin port" >&2
