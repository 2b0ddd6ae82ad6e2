#!/usr/bin/env bash
# Builds a release of shardgate into dist/ (docs/releases.md says how a release is cut):
#
#   scripts/release.sh vX.Y.Z      the tagged commit: the router for Linux, macOS and Windows,
#                                  SHA256SUMS, and both images (shardgate/router:vX.Y.Z,
#                                  shardgate/postgres:15-vX.Y.Z) with their version labels
#   scripts/release.sh --snapshot  the working tree, under a snapshot version: the binaries and
#                                  SHA256SUMS, no images (make test runs this)
#
# Every binary is built with -trimpath and the version in its link flags (-X main.version), and
# is checked to carry it: the one this machine can run must print it from `router version`, the
# others must hold it (-trimpath keeps the link flags out of `go version -m`).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/release.sh vX.Y.Z | --snapshot" >&2; exit 2; }
fail() { echo "release: $*" >&2; exit 1; }

GO="${GO:-go}"
snapshot=false
case "${1:-}" in
--snapshot)
	snapshot=true
	version="$(git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo devel)-snapshot"
	;;
v*) version="$1" ;;
*) usage ;;
esac
[ $# -eq 1 ] || usage

if ! $snapshot; then
	[[ "$version" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
		fail "$version is not a semantic version such as v0.1.0 or v1.2.0-rc.1"
	[ -z "$(git status --porcelain)" ] || fail "the working tree has changes; a release is built from the tagged commit alone"
	tagged="$(git rev-parse -q --verify "refs/tags/$version^{commit}" || true)"
	[ -n "$tagged" ] || fail "there is no tag $version; tag the release commit first: git tag -a $version -m $version"
	[ "$tagged" = "$(git rev-parse HEAD)" ] || fail "tag $version is not the checked-out commit; git checkout $version"
	grep -q "^## \[${version#v}\]" CHANGELOG.md || fail "CHANGELOG.md has no section ## [${version#v}]"
fi
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"

rm -rf dist
mkdir -p dist
host="$($GO env GOOS)/$($GO env GOARCH)"
for target in linux/amd64 linux/arm64 darwin/arm64 darwin/amd64 windows/amd64; do
	os="${target%/*}" arch="${target#*/}" ext=""
	[ "$os" = windows ] && ext=.exe
	out="dist/router_${version}_${os}_${arch}${ext}"
	CGO_ENABLED=0 GOOS="$os" GOARCH="$arch" $GO build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out" ./cmd/router
	grep -qaF -- "$version" "$out" || fail "$out does not carry version $version"
	if [ "$target" = "$host" ]; then
		said="$("$out" version)"
		[[ "$said" == "router $version "* ]] || fail "$out version printed \"$said\", want router $version"
		echo "release: $said" >&2
	fi
done
(cd dist && sha256sum router_* >SHA256SUMS)
echo "release: dist/ holds $(ls dist | grep -c '^router_') binaries of $version and SHA256SUMS" >&2

$snapshot && exit 0
export SHARDGATE_VERSION="$version" SHARDGATE_REVISION="$revision"
SHARDGATE_ROUTER_IMAGE="shardgate/router:$version" ./deploy/images/build-router-image.sh
SHARDGATE_PG_IMAGE="shardgate/postgres:15-$version" ./deploy/images/build-postgres-image.sh
