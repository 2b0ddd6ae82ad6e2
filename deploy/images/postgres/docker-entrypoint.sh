#!/bin/bash
# Entrypoint of shardgate/postgres:15, a drop-in for the official postgres image's contract:
#   POSTGRES_USER (default postgres), POSTGRES_PASSWORD (required unless
#   POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_DB (default $POSTGRES_USER),
#   POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD (default scram-sha-256),
#   /docker-entrypoint-initdb.d/*.sh|*.sql|*.sql.gz run once on an empty data directory,
#   and `postgres -c key=value ...` (or bare `-c ...`) passed through to the server.
# Anything else given as the command is executed as is (e.g. `bash`).
set -Eeuo pipefail

# `docker run IMAGE -c fsync=off` means `postgres -c fsync=off`, as in the official image.
if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi
if [ "$1" != 'postgres' ]; then
	exec "$@"
fi

# As root: own the data and socket directories, then run this script again as postgres, because
# PostgreSQL refuses to run as root.
if [ "$(id -u)" = '0' ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	chmod 3777 /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != 'trust' ]; then
		echo >&2 'error: database is uninitialized and POSTGRES_PASSWORD is not set; set it, or POSTGRES_HOST_AUTH_METHOD=trust (never in production)'
		exit 1
	fi
	mkdir -p "$PGDATA"
	chmod 700 "$PGDATA" 2>/dev/null || :
	# The password goes through a pipe, never the command line, so `ps` cannot show it.
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a word list by contract
	initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
		-D "$PGDATA" ${POSTGRES_INITDB_ARGS:-} >/dev/null
	printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	# A socket-only temporary server: nothing outside the container sees a half-initialised
	# database, which is why "ready to accept connections" is logged twice.
	# Its log is left on stdout, like the official image's: tools that wait for the second
	# "ready to accept connections" (testcontainers' BasicWaitStrategies) then work unchanged.
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	export PGPASSWORD="${POSTGRES_PASSWORD:-}"
	psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --no-password)
	if [ "$POSTGRES_DB" != 'postgres' ]; then
		"${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<-'SQL' >/dev/null
			SELECT 'CREATE DATABASE ' || quote_ident(:'db') WHERE NOT EXISTS
			  (SELECT FROM pg_database WHERE datname = :'db')\gexec
		SQL
	fi
	psql+=(--dbname "$POSTGRES_DB")
	shopt -s nullglob
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			if [ -x "$f" ]; then
				echo "$0: running $f"
				"$f"
			else
				echo "$0: sourcing $f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) echo "$0: running $f"; "${psql[@]}" -f "$f" ;;
		*.sql.gz) echo "$0: running $f"; gunzip -c "$f" | "${psql[@]}" ;;
		*) echo "$0: ignoring $f" ;;
		esac
	done
	unset PGPASSWORD
	pg_ctl -D "$PGDATA" -m fast -w stop
	echo "$0: PostgreSQL init process complete; ready for start up."
fi

exec "$@"
