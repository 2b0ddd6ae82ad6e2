#!/usr/bin/env bash
# Builds shardgate/router:dev (override with SHARDGATE_ROUTER_IMAGE): a static ./cmd/router in an
# image with nothing else in it. It is made by `docker import` of a tar holding the binary, so
# no base image is needed and nothing is pulled.
#
# Always rebuilds (a few seconds; Go's build cache makes an unchanged binary cheap), because a
# stale router image would test old code. The image runs as uid 65532, not root.
set -euo pipefail

image="${SHARDGATE_ROUTER_IMAGE:-shardgate/router:dev}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs/tmp"
(cd "$repo" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$work/rootfs/router" ./cmd/router)
chmod 1777 "$work/rootfs/tmp"
# Numeric owner 0 keeps the image reproducible whoever builds it; the binary is world-executable.
tar --numeric-owner --owner=0 --group=0 -C "$work/rootfs" -c router tmp |
	docker import \
		--change 'ENTRYPOINT ["/router"]' \
		--change 'CMD ["serve", "--config", "/etc/shardgate/router.yaml"]' \
		--change 'USER 65532:65532' \
		--change 'EXPOSE 8080' \
		--change 'WORKDIR /' \
		- "$image" >/dev/null
docker image inspect --format 'build-router-image: {{index .RepoTags 0}} {{.Size}} bytes' "$image" >&2
