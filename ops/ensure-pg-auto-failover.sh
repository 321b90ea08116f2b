#!/usr/bin/env bash
# Install pg_auto_failover for the PostgreSQL major version installed here when it is missing:
# Debian's postgresql-<major>-auto-failover (the monitor's extension) and, by its dependency,
# pg-auto-failover-cli (pg_autoctl).
# `make chaos` needs it for its failover fault (tests/chaos/autofailover.py); nothing is
# started or configured here.
set -euo pipefail
have_pgaf() {
  command -v pg_autoctl >/dev/null 2>&1 \
    && compgen -G '/usr/share/postgresql/*/extension/pgautofailover.control' >/dev/null
}
if have_pgaf; then exit 0; fi
major=""
for dir in /usr/lib/postgresql/*/bin/pg_ctl; do
  [ -e "$dir" ] || continue
  major="$(basename "$(dirname "$(dirname "$dir")")")"
done
if [ -z "$major" ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "the failover fault needs pg_auto_failover (pg_autoctl) for the installed PostgreSQL." >&2
  echo "Install it, e.g. 'sudo apt-get install postgresql-15-auto-failover', then retry." >&2
  exit 1
fi
echo "installing pg_auto_failover (apt-get install postgresql-$major-auto-failover)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "postgresql-$major-auto-failover" >/dev/null \
  || { apt-get update -qq \
       && apt-get install -y -qq --no-install-recommends "postgresql-$major-auto-failover" \
          >/dev/null; }
have_pgaf
