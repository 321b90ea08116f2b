#!/usr/bin/env bash
# Install promtool (Debian's `prometheus` package) when it is missing: the tests check
# ops/prometheus/alerts.yml with `promtool check rules` and run ops/prometheus/alerts_test.yml
# with `promtool test rules`. Only the binary is wanted: the package's server is not started
# here (policy-rc.d denies it) and nothing else of it is configured.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "promtool is missing; the alert rule tests will be skipped." >&2
  echo "Install it, e.g. 'sudo apt-get install prometheus', then retry." >&2
  exit 1
fi
echo "installing promtool (apt-get install prometheus)" >&2
export DEBIAN_FRONTEND=noninteractive
# a package's postinst must not start the Prometheus server on a test machine
cleanup=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  cleanup=/usr/sbin/policy-rc.d
fi
trap '[ -z "$cleanup" ] || rm -f "$cleanup"' EXIT
apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
command -v promtool >/dev/null 2>&1
