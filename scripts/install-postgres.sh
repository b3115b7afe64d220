#!/usr/bin/env bash
# The PostgreSQL server the stack tests run Prefect and MLflow on (tests/support/postgres_server.py starts a throwaway one
# per test module, as the `postgres` user, on 127.0.0.1 at a free port): Debian's `postgresql`, installed if its
# initdb/pg_ctl are missing (needs root and apt, as on the CI machine; elsewhere install it yourself, or set
# SWEEPFLOW_SKIP_POSTGRES_TESTS=1). Debian's package rather than a server shipped on PyPI: it is the build the
# distribution maintains and patches, and it brings the `postgres` system user the server must run as (it refuses
# to run as root). Where services start at install time it also creates and starts a `main` cluster on port 5432;
# the tests never use it.
set -euo pipefail
found() {
    command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null && compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if found; then
    exit 0
fi
exec bash "$(dirname "$0")/apt-install.sh" postgresql SWEEPFLOW_SKIP_POSTGRES_TESTS \
    "the database server of the stack tests"
