#!/usr/bin/env bash
# Install Debian's Chromium when it is missing: the console's browser tests (tests/browser) drive
# it through Playwright with executable_path, never a browser download (which cannot work here).
# QUEEN_CHROMIUM names another binary to use instead.
set -euo pipefail
want="${QUEEN_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$want" ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "the browser tests need Chromium at $want." >&2
  echo "Install it, e.g. 'sudo apt-get install chromium', or set QUEEN_CHROMIUM, then retry." >&2
  exit 1
fi
echo "installing Chromium (apt-get install chromium)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
