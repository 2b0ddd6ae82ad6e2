#!/usr/bin/env bash
# Builds shardgate/postgres:15 (override with SHARDGATE_PG_IMAGE) from Debian's postgresql-15
# package, for machines that cannot pull the official postgres:15 image. The image honours the
# official image's contract (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d, `postgres
# -c ...`), so testcontainers' postgres module and the compose file work with either image.
#
# Idempotent: does nothing when the image exists. --force rebuilds.
# Needs root (mmdebstrap, docker) and Debian's package mirror; takes about 1-2 minutes.
set -euo pipefail

image="${SHARDGATE_PG_IMAGE:-shardgate/postgres:15}"
suite="${SHARDGATE_PG_SUITE:-bookworm}"
force=false
case "${1:-}" in
--force) force=true ;;
"") ;;
*) echo "usage: $0 [--force]   (image name from SHARDGATE_PG_IMAGE, default shardgate/postgres:15)" >&2; exit 2 ;;
esac

if ! $force && docker image inspect "$image" >/dev/null 2>&1; then
	echo "build-postgres-image: $image exists; --force rebuilds it" >&2
	exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
	if [ "$(id -u)" != 0 ]; then
		echo "build-postgres-image: mmdebstrap is missing; run as root or: sudo apt-get install -y mmdebstrap" >&2
		exit 1
	fi
	echo "build-postgres-image: installing mmdebstrap" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
fi

here="$(cd "$(dirname "$0")" && pwd)"
base="${image%:*}-rootfs:${image##*:}"
[ "$base" != "$image" ] || base="$image-rootfs"

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

echo "build-postgres-image: adding the entrypoint, image $image" >&2
docker build --quiet --pull=false --build-arg "BASE=$base" -t "$image" "$here/postgres" >/dev/null
docker image inspect --format 'build-postgres-image: {{index .RepoTags 0}} {{.Size}} bytes' "$image" >&2
