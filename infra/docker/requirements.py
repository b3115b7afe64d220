"""The image's requirements, one per line: pyproject.toml's runtime dependencies and those of the extras named.

    python requirements.py pyproject.toml postgres        -> the default image (MLflow on PostgreSQL)
    python requirements.py pyproject.toml postgres,auth   -> an image whose MLflow server runs the basic-auth app

The Dockerfile installs them in a layer of its own, built from pyproject.toml alone (rebuilt only when it
changes), then the code with ``--no-deps``. An unknown extra is refused: a typo would build an image without
what its server needs.
"""

from __future__ import annotations

import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    known = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise SystemExit(f"unknown extra(s) {', '.join(unknown)}: pyproject.toml has {', '.join(sorted(known))}")
    out = list(project["dependencies"])
    for extra in extras:
        out += [r for r in known[extra] if r not in out]
    return out


def main(argv: list[str]) -> int:
    path, extras = argv[0], [e.strip() for e in (argv[1] if len(argv) > 1 else "").split(",") if e.strip()]
    with open(path, "rb") as f:
        print("\n".join(requirements(tomllib.load(f), extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
