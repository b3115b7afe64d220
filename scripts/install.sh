#!/usr/bin/env bash
# Create or refresh .venv with sweepflow and (optionally) its dev extras.
#   scripts/install.sh          -> runtime packages
#   scripts/install.sh dev      -> runtime + test/lint packages
# Uses uv (installed into the venv by pip) for speed. uv ignores pip's configuration, so the
# machine's pip settings (extra indexes, find-links, constraints) are passed on explicitly:
# on a normal machine there are none and torch comes from the public index.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check uv
fi

uv_args=()
while IFS= read -r line; do
  key="${line%%=*}"; val="${line#*=}"; val="${val//\'/}"
  case "$key" in
    *extra-index-url) for u in $val; do uv_args+=(--extra-index-url "$u"); done ;;
    *find-links) for u in $val; do uv_args+=(--find-links "$u"); done ;;
    *constraint) for u in $val; do [ -f "$u" ] && uv_args+=(--constraint "$u"); done ;;
  esac
done < <(.venv/bin/python -m pip config list 2>/dev/null || true)
if [ ${#uv_args[@]} -gt 0 ]; then
  uv_args+=(--index-strategy unsafe-best-match)
fi

target="."
[ -n "$extras" ] && target=".[${extras}]"
.venv/bin/uv pip install --python .venv/bin/python ${uv_args[@]+"${uv_args[@]}"} -e "$target"
