#!/usr/bin/env bash
# One lane of the version matrix: a venv of its own under .lanes/ on one Python (and optionally one torch and
# torchvision), the dev install, and the fast lane (`make test-fast`'s selection: no servers, no clusters).
#   scripts/test-lane.sh 3.12                      -> Python 3.12, the newest torch pyproject.toml allows here
#   scripts/test-lane.sh 3.11 2.6.0 0.21.0         -> Python 3.11, torch 2.6.0 and torchvision 0.21.0
# The interpreter is python3.X on PATH, else pyenv's (`pyenv root`/versions/3.X.*). Exits 3 when the machine
# has no such Python (.ci/run then says so and goes on), else with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
version="$1"; torch="${2:-}"; torchvision="${3:-}"

find_python() {
  local candidate
  if candidate="$(command -v "python$version")" && "$candidate" -c "" >/dev/null 2>&1; then
    echo "$candidate"; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    for candidate in "$(pyenv root)/versions/$version".*/bin/"python$version"; do
      [ -x "$candidate" ] && { echo "$candidate"; return; }
    done
  fi
  return 1
}
python="$(find_python)" || { echo "no Python $version on this machine" >&2; exit 3; }

name="py$version${torch:+-torch$torch}"
pins=""
[ -n "$torch" ] && pins="torch==$torch${torchvision:+ torchvision==$torchvision}"
mkdir -p .lanes
started=$SECONDS
PYTHON="$python" VENV=".lanes/$name" TORCH_PINS="$pins" bash scripts/install.sh dev >".lanes/$name.install.log" 2>&1 \
  || { cat ".lanes/$name.install.log" >&2; exit 1; }
rm -f ".lanes/$name.install.log"
installed=$((SECONDS - started))
".lanes/$name/bin/python" -c 'import sys, torch, torchvision; print(f"== lane {sys.argv[1]}: Python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__}")' "$name"
started=$SECONDS
status=0
".lanes/$name/bin/python" -m pytest -q -p no:cacheprovider -m "$(sed -n 's/^FAST_LANE = //p' Makefile)" || status=$?
echo "== lane $name: install ${installed} s, fast lane $((SECONDS - started)) s, exit $status"
exit $status
