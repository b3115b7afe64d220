"""Commands a user runs from the checkout's root (where prefect.yaml is): `prefect deploy`, `prefect deployment run`."""

from __future__ import annotations

import subprocess

import paths

ROOT = str(paths.ROOT)


def run_from_checkout(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` from the checkout's root; it must succeed (the test fails with its output)."""
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc
