#!/usr/bin/env bash
# Builds shardgate/router:dev (override with SHARDGATE_ROUTER_IMAGE): a static ./cmd/router in an
# image with nothing else in it. It is made by `docker import` of a tar holding the binary, so
# no base image is needed and nothing is pulled.
#
# The binary carries the version (router version, /healthz) and the image the same in its OCI labels
# (org.opencontainers.image.version, .revision, .source, .licenses).
#
# Always rebuilds (a few seconds; Go's build cache makes an unchanged binary cheap), because a
# stale router image would test old code. The image runs as uid 65532, not root.
set -euo pipefail

image="${SHARDGATE_ROUTER_IMAGE:-shardgate/router:dev}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# The version the binary, /healthz and the image's labels report: SHARDGATE_VERSION (the release
# script sets the tag), else what git describes of the checkout.
version="${SHARDGATE_VERSION:-$(git -C "$repo" describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo devel)}"
revision="${SHARDGATE_REVISION:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs/tmp"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=$version" -o "$work/rootfs/router" ./cmd/router)
chmod 1777 "$work/rootfs/tmp"
# Numeric owner 0 keeps the image reproducible whoever builds it; the binary is world-executable.
tar --numeric-owner --owner=0 --group=0 -C "$work/rootfs" -c router tmp |
	docker import \
		--change 'ENTRYPOINT ["/router"]' \
		--change 'CMD ["serve", "--config", "/etc/shardgate/router.yaml"]' \
		--change 'USER 65532:65532' \
		--change 'EXPOSE 8080' \
		--change 'WORKDIR /' \
		--change "LABEL org.opencontainers.image.version=$version" \
		--change "LABEL org.opencontainers.image.revision=$revision" \
		--change 'LABEL org.opencontainers.image.source=https://github.com/shardgate/shardgate' \
		--change 'LABEL org.opencontainers.image.licenses=Apache-2.0' \
		--change 'LABEL org.opencontainers.image.title=shardgate-router' \
		- "$image" >/dev/null
docker image inspect --format 'build-router-image: {{index .RepoTags 0}} {{.Size}} bytes, version {{index .Config.Labels "org.opencontainers.image.version"}}' "$image" >&2
