#!/usr/bin/env bash
# Install PostgreSQL server binaries from Debian's packages when none are present.
# The broker's embedded mode and the test harness need initdb/pg_ctl/postgres; psycopg's C
# build needs libpq's headers and pg_config.
set -euo pipefail
have_pg() {
  { command -v pg_ctl >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null; } \
    && command -v pg_config >/dev/null 2>&1 && [ -e "$(pg_config --includedir)/libpq-fe.h" ]
}
if have_pg; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "queen-mp needs PostgreSQL server binaries (initdb, pg_ctl, postgres)." >&2
  echo "Install them, e.g. 'sudo apt-get install postgresql', then retry." >&2
  exit 1
fi
echo "installing PostgreSQL server binaries (apt-get install postgresql)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql postgresql-contrib libpq-dev gcc python3-dev >/dev/null
