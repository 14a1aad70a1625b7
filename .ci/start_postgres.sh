#!/bin/sh
# Start the Debian PostgreSQL cluster on loopback and create the store's test role and database.
# Run as root. Installs nothing; idempotent (a second run finds everything in place).
# Prints the SQLAlchemy URL for CSD_TEST_PG_URL on stdout (progress goes to stderr).
set -eu
CLUSTER=main
VER=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -n 1)
[ -n "$VER" ] || { echo "start_postgres: no PostgreSQL server in /usr/lib/postgresql" >&2; exit 1; }

row() { pg_lsclusters -h | awk -v v="$VER" -v c="$CLUSTER" '$1 == v && $2 == c'; }
if [ -z "$(row)" ]; then
    echo "start_postgres: creating cluster $VER/$CLUSTER" >&2
    pg_createcluster "$VER" "$CLUSTER" -p 5432 >&2
fi
printf "listen_addresses = '127.0.0.1'\n" > "/etc/postgresql/$VER/$CLUSTER/conf.d/csd-loopback.conf"
PORT=$(row | awk '{print $3}')
if [ "$(row | awk '{print $4}')" != online ]; then
    pg_ctlcluster "$VER" "$CLUSTER" start >&2
fi
i=0
until pg_isready -q -h 127.0.0.1 -p "$PORT"; do
    i=$((i + 1)); [ "$i" -lt 30 ] || { echo "start_postgres: server not ready on 127.0.0.1:$PORT" >&2; exit 1; }
    sleep 1
done

cd /
runuser -u postgres -- psql -q -X -v ON_ERROR_STOP=1 -p "$PORT" -d postgres >&2 <<'SQL'
SELECT 'CREATE ROLE csd' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'csd')\gexec
ALTER ROLE csd LOGIN PASSWORD 'csd';
SELECT 'CREATE DATABASE csd_test OWNER csd' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'csd_test')\gexec
SQL
echo "postgresql+psycopg://csd:csd@127.0.0.1:$PORT/csd_test"
