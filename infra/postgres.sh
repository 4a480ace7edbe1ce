#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on 127.0.0.1:5432 for the tests. Uses the one already running
# if there is one; otherwise installs Debian's `postgresql` and starts its cluster (as the postgres
# user: the server refuses to run as root) with password auth for user postgres/postgres.
set -euo pipefail
ready() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if command -v pg_isready >/dev/null && ready; then echo "postgres: already running"; exit 0; fi
sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "postgres: installing Debian's postgresql"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$version main$"; then
  $sudo_ pg_createcluster "$version" main >/dev/null
fi
$sudo_ pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 60); do ready && break; sleep 0.5; done
ready || { echo "postgres: did not start"; exit 1; }
$sudo_ su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null
echo "postgres: started $version"
