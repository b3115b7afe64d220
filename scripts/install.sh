#!/usr/bin/env bash
# Create or refresh .venv with sweepflow and (optionally) its dev extras.
#   scripts/install.sh          -> runtime packages
#   scripts/install.sh dev      -> runtime + test/lint packages
# Optional environment: PYTHON (the interpreter a new venv is made from; default python3.11, else python3),
# VENV (the venv's folder; default .venv), and TORCH_PINS (requirements installed with it, e.g.
# "torch==2.6.0 torchvision==0.21.0": scripts/test-lane.sh tests the ends of pyproject.toml's ranges so).
# Uses uv (installed into the venv by pip) for speed. uv ignores pip's configuration, so the
# machine's pip settings (extra indexes, find-links, constraints) are passed on explicitly:
# on a normal machine there are none and torch comes from the public index.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV="${VENV:-.venv}"
read -r -a pins <<< "${TORCH_PINS:-}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  touch "$VENV/.sweepflow-bytecode"  # a new venv: uv compiles everything it installs below (--compile-bytecode)
fi
if [ ! -x "$VENV/bin/uv" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv
fi

uv_args=()
while IFS= read -r line; do
  key="${line%%=*}"; val="${line#*=}"; val="${val//\'/}"
  case "$key" in
    *extra-index-url) for u in $val; do uv_args+=(--extra-index-url "$u"); done ;;
    *find-links) for u in $val; do uv_args+=(--find-links "$u"); done ;;
    *constraint) for u in $val; do [ -f "$u" ] && uv_args+=(--constraint "$u"); done ;;
  esac
done < <("$VENV/bin/python" -m pip config list 2>/dev/null || true)
if [ ${#uv_args[@]} -gt 0 ]; then
  uv_args+=(--index-strategy unsafe-best-match)
fi

target="."
[ -n "$extras" ] && target=".[${extras}]"
# --compile-bytecode: the .pyc files of what this command installs (uv 0.13 compiles only those), written now. uv
# writes none by default and leaves it to the first import, which cannot write them where PYTHONDONTWRITEBYTECODE=1
# is set (this machine, CI): every Python process then compiled torch, torchvision, scikit-learn, MLflow and Prefect
# from source again on each start (importing torch, torchvision and sklearn.datasets took 22 s instead of 7.7;
# benchmarks/RESULTS.md).
"$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode ${uv_args[@]+"${uv_args[@]}"} -e "$target" \
  ${pins[@]+"${pins[@]}"}
# A venv made before that flag: compile what it already holds, once (about a minute on 2 cores). compileall exits 1
# for the few files in site-packages that are not valid Python 3.11 (templates and test data inside packages):
# those are never imported, so that status is not a failure here.
if [ ! -f "$VENV/.sweepflow-bytecode" ]; then
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
  touch "$VENV/.sweepflow-bytecode"
fi
# sweepflow's own modules (an editable install: they stay in the checkout). An edited file's stale .pyc is ignored.
"$VENV/bin/python" -m compileall -q -j 0 ddp_runtime flows tasks infra >/dev/null
