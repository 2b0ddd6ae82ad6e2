#!/usr/bin/env bash
# Builds shardgate/postgres:15 (override with SHARDGATE_PG_IMAGE) from Debian's postgresql-15
# package, for machines that cannot pull the official postgres:15 image. The image honours the
# official image's contract (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d, `postgres
# -c ...`), so testcontainers' postgres module and the compose file work with either image.
#
# Idempotent: does nothing when the image exists and was built from the current postgres/
# directory (entrypoint, Dockerfile) for the same shardgate version (SHARDGATE_VERSION, else git
# describe; it is the image's org.opencontainers.image.version label); when only those changed,
# redoes just the cheap second stage.
# --force also redoes the Debian bootstrap. Needs root (mmdebstrap, docker) and Debian's package
# mirror; the bootstrap takes 1-2 minutes on an idle 2-core machine (6 on a loaded one).
set -euo pipefail

image="${SHARDGATE_PG_IMAGE:-shardgate/postgres:15}"
suite="${SHARDGATE_PG_SUITE:-bookworm}"
force=false
case "${1:-}" in
--force) force=true ;;
"") ;;
*) echo "usage: $0 [--force]   (image name from SHARDGATE_PG_IMAGE, default shardgate/postgres:15)" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "$0")" && pwd)"
base="${image%:*}-rootfs:${image##*:}"
[ "$base" != "$image" ] || base="$image-rootfs"
# The second stage's inputs, recorded as a label so an edited entrypoint is never left unbuilt.
context_sum="$(cd "$here/postgres" && sha256sum Dockerfile docker-entrypoint.sh | sha256sum | cut -c1-16)"
label=dev.shardgate.context
# shardgate's release this image belongs to, in its OCI labels as in the router image's.
version="${SHARDGATE_VERSION:-$(git -C "$here/../.." describe --tags --always --dirty 2>/dev/null || echo devel)}"
revision="${SHARDGATE_REVISION:-$(git -C "$here/../.." rev-parse HEAD 2>/dev/null || echo unknown)}"

labels="$(docker image inspect --format "{{index .Config.Labels \"$label\"}} {{index .Config.Labels \"org.opencontainers.image.version\"}}" "$image" 2>/dev/null || true)"
if ! $force && [ "$labels" = "$context_sum $version" ]; then
	echo "build-postgres-image: $image is up to date; --force rebuilds it" >&2
	exit 0
fi
# Stage 1, the slow part: a root filesystem from Debian packages, kept for later rebuilds.
if $force || ! docker image inspect "$base" >/dev/null 2>&1; then
	if ! command -v mmdebstrap >/dev/null; then
		if [ "$(id -u)" != 0 ]; then
			echo "build-postgres-image: mmdebstrap is missing; run as root or: sudo apt-get install -y mmdebstrap" >&2
			exit 1
		fi
		echo "build-postgres-image: installing mmdebstrap" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
	fi

	echo "build-postgres-image: bootstrapping $suite with postgresql-15 into $base" >&2
	# Docs, man pages and translations are dropped as dpkg unpacks them: about a third of the size
	# for nothing a server uses. The cluster Debian's postinst creates is removed: the entrypoint
	# makes its own in $PGDATA, as the official image does.
	mmdebstrap --variant=minbase --include=postgresql-15 --quiet \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-include=/usr/share/locale/locale.alias' \
		--customize-hook='rm -rf "$1"/var/lib/postgresql/15 "$1"/etc/postgresql/15 "$1"/var/cache/apt/* "$1"/var/log/*.log' \
		"$suite" - |
		docker import \
			--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'ENV PGDATA=/var/lib/postgresql/data' \
			--change 'ENV LANG=C.UTF-8' \
			--change 'CMD ["postgres"]' \
			- "$base" >/dev/null
fi

# Stage 2: the entrypoint, on top of the local root filesystem (nothing is pulled).
echo "build-postgres-image: adding the entrypoint, image $image" >&2
# The legacy builder needs no buildx plugin; its deprecation notice is noise here.
if ! out="$(DOCKER_BUILDKIT=0 docker build --quiet --pull=false --build-arg "BASE=$base" \
	--label "$label=$context_sum" \
	--label "org.opencontainers.image.version=$version" \
	--label "org.opencontainers.image.revision=$revision" \
	--label "org.opencontainers.image.source=https://github.com/shardgate/shardgate" \
	--label "org.opencontainers.image.licenses=Apache-2.0" \
	--label "org.opencontainers.image.title=shardgate-postgres" \
	-t "$image" "$here/postgres" 2>&1)"; then
	echo "$out" >&2
	exit 1
fi
docker image inspect --format 'build-postgres-image: {{index .RepoTags 0}} {{.Size}} bytes' "$image" >&2
