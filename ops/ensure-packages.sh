#!/usr/bin/env bash
# Install from Debian's packages what the broker and its tests need and this machine lacks:
#   postgres  server binaries (initdb, pg_ctl, postgres) for the embedded mode and the test
#             harness, libpq's headers and pg_config for psycopg's C build;
#   chromium  the console's browser tests (tests/browser) drive it through Playwright with
#             executable_path, never a browser download (which cannot work here);
#             QUEEN_CHROMIUM names another binary to use instead;
#   promtool  (Debian's `prometheus` package) for the alert rule tests; optional: without it
#             tests/unit/test_alert_rules.py skips and says why.
# Usage: ensure-packages.sh postgres|chromium|promtool...
# What is present costs nothing; what is missing is installed in ONE apt-get install (a fresh
# CI machine pays for each apt-get run), with `apt-get update` only when the package lists
# cannot serve it. No service of the installed packages is started (policy-rc.d denies it): the
# tests start their own PostgreSQL, and only promtool's binary is wanted of prometheus.
set -euo pipefail

have_postgres() {
  { command -v pg_ctl >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null; } \
    && command -v pg_config >/dev/null 2>&1 && [ -e "$(pg_config --includedir)/libpq-fe.h" ]
}
have_chromium() { [ -x "${QUEEN_CHROMIUM:-/usr/bin/chromium}" ]; }
have_promtool() { command -v promtool >/dev/null 2>&1; }

declare -A DEBS=([postgres]="postgresql postgresql-contrib libpq-dev gcc python3-dev"
                 [chromium]="chromium" [promtool]="prometheus")
declare -A NEED=(
  [postgres]="queen-mp needs PostgreSQL server binaries (initdb, pg_ctl, postgres): install them, e.g. 'sudo apt-get install postgresql'"
  [chromium]="the browser tests need Chromium at ${QUEEN_CHROMIUM:-/usr/bin/chromium}: install it, e.g. 'sudo apt-get install chromium', or set QUEEN_CHROMIUM"
  [promtool]="promtool is missing; the alert rule tests will be skipped: install it, e.g. 'sudo apt-get install prometheus'")

missing=()
packages=()
for what in "$@"; do
  [ -n "${DEBS[$what]:-}" ] || { echo "ensure-packages.sh: unknown '$what'" >&2; exit 2; }
  if ! "have_$what"; then
    missing+=("$what")
    read -ra debs <<<"${DEBS[$what]}"
    packages+=("${debs[@]}")
  fi
done
[ "${#missing[@]}" -gt 0 ] || exit 0

# every one of `missing` is still missing after the install attempt: say so, fail if required
report() {
  local status=0 what
  for what in "${missing[@]}"; do
    "have_$what" && continue
    echo "${NEED[$what]}, then retry." >&2
    [ "$what" = promtool ] || status=1
  done
  return "$status"
}

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  report
  exit
fi
echo "installing ${missing[*]} (apt-get install ${packages[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
cleanup=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  cleanup=/usr/sbin/policy-rc.d
fi
trap '[ -z "$cleanup" ] || rm -f "$cleanup"' EXIT
install() { apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; }
install 2>/dev/null || { apt-get update -qq && install; } || true
report
