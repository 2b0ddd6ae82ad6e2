#!/usr/bin/env bash
# The container half of the test suite (docs/testing.md, "Containers"): builds the images from Debian
# packages (no registry needed), runs the container module's tests (an Env, a shard cut off the
# network, the bank fault suite) on shard and router containers, and the compose smoke test. Needs a running Docker Engine.
set -euo pipefail
cd "$(dirname "$0")/.."

docker info >/dev/null 2>&1 || { echo "test-containers: Docker Engine unreachable; the container suites need it" >&2; exit 1; }
for c in docker-compose curl; do
  command -v "$c" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$c" >/dev/null; }
done
sweep_containers() { # whatever a crashed run left behind; only shardgate's own labels
  for l in dev.shardgate.test=true dev.shardgate.compose=true; do
    docker ps -aq --filter "label=$l" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
  done
  docker network ls -q --filter label=dev.shardgate.test=true | xargs -r docker network rm >/dev/null 2>&1 || true
}
sweep_containers
trap sweep_containers EXIT
timeout 15m ./deploy/images/build-postgres-image.sh
timeout 10m ./deploy/images/build-router-image.sh
# The Docker backend is a module of its own (shardgatetest/containers, built against this
# checkout by its replace directive): an Env and a shard cut off the network on containers,
# then the bank fault suite.
(cd shardgatetest/containers && SHARDGATE_TEST_BACKEND=docker go test -race -count=1 -timeout 10m .)
# -v: the fault suite's checker prints its counts (acknowledged, failed, unknown, replays, sums).
out=$(cd shardgatetest/containers && SHARDGATE_TEST_BACKEND=docker go test -race -count=1 -timeout 10m -v ./faults/ 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E '^(--- |ok )|bank_test.go|bank summary'

SHARDGATE_SMOKE_TIMEOUT=180 timeout 5m ./deploy/compose/smoke.sh
