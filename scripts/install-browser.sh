#!/usr/bin/env bash
# The headless browser the report tests render pages in: Debian's chromium, installed if missing (needs root and
# apt, as on the CI machine; elsewhere: install it yourself, or set SWEEPFLOW_SKIP_BROWSER_TESTS=1).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
exec bash "$(dirname "$0")/apt-install.sh" chromium SWEEPFLOW_SKIP_BROWSER_TESTS "headless browser for the report tests"
