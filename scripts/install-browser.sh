#!/usr/bin/env bash
# The headless browser the report tests render pages in: Debian's chromium, installed if missing (needs root and
# apt, as on the CI machine; elsewhere: install it yourself, or set SWEEPFLOW_SKIP_BROWSER_TESTS=1).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "${SWEEPFLOW_SKIP_BROWSER_TESTS:-}" = "1" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (headless browser for the report tests)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
    exit 0
fi
echo "scripts/install-browser.sh: no chromium, and cannot install it here (needs root and apt-get): install" \
     "Debian's chromium (sudo apt-get install --no-install-recommends chromium) or set SWEEPFLOW_SKIP_BROWSER_TESTS=1" >&2
exit 2
