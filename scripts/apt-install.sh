#!/usr/bin/env bash
# apt-install.sh PACKAGE SKIP_VARIABLE PURPOSE: install a Debian package the tests need (the caller has checked it
# is missing), unless SKIP_VARIABLE=1. Needs root and apt, as on the CI machine; elsewhere it says what to do.
set -euo pipefail
package=$1 skip=$2 purpose=$3
if [ "${!skip:-}" = "1" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $package ($purpose)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
    exit 0
fi
echo "no $package ($purpose), and cannot install it here (needs root and apt-get): install Debian's $package" \
     "(sudo apt-get install --no-install-recommends $package) or set $skip=1" >&2
exit 2
