"""The warm launcher (``sweepflow.services.launcher``): what it imports before it is ready and what once idle.

A real launcher process with a test program (``launcher_entry.main``) and a late module (``launcher_late``),
driven through the client ``sweepflow run`` uses (``launcher.run``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from sweepflow.services import launcher

pytestmark = pytest.mark.subprocess


@contextlib.contextmanager
def serving(state_dir: str, *, idle_seconds: float) -> Iterator[tuple[psutil.Process, str]]:
    """A launcher for ``launcher_entry:main`` that imports ``launcher_late`` when idle; (process, its log)."""
    os.makedirs(os.path.join(state_dir, "services"), exist_ok=True)
    ready = os.path.join(state_dir, "services", "launcher.ready")
    log = os.path.join(state_dir, "launcher.log")
    code = (
        "import sys\nfrom sweepflow.services.launcher import serve\n"
        "serve(sys.argv[1], sys.argv[2], entry='launcher_entry:main', preload_when_idle=['launcher_late'], "
        "idle_seconds=float(sys.argv[3]))\n"
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, launcher.socket_path(state_dir), ready, str(idle_seconds)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            assert proc.poll() is None and time.monotonic() < deadline, open(log).read()
            time.sleep(0.05)
        yield psutil.Process(proc.pid), log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _run(state_dir: str, out: str, sleep: float = 0.0) -> dict:
    assert launcher.run(state_dir, [out, str(sleep)], started_at=time.time()) == 0
    with open(out) as f:
        return json.load(f)


def _wait_for_line(log: str, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in open(log).read():
        assert time.monotonic() < deadline, open(log).read()
        time.sleep(0.05)


def test_the_idle_preload_never_runs_beside_a_run_and_the_next_run_has_it(tmp_path):
    state_dir = str(tmp_path)
    with serving(state_dir, idle_seconds=2) as (proc, log):
        cpu = proc.cpu_times()
        # A run that starts at once and lasts past the idle delay: the import waits for it to end, and meanwhile
        # the launcher only waits (no polling loop).
        assert _run(state_dir, str(tmp_path / "first.json"), sleep=4.0) == {"late_imported": False}
        after = proc.cpu_times()
        assert (after.user + after.system) - (cpu.user + cpu.system) < 0.5, "the launcher spun while a run went on"
        _wait_for_line(log, "imported launcher_late while idle")
        assert _run(state_dir, str(tmp_path / "second.json")) == {"late_imported": True}


def test_the_idle_preload_also_comes_when_no_run_does(tmp_path):
    state_dir = str(tmp_path)
    with serving(state_dir, idle_seconds=1) as (_, log):
        _wait_for_line(log, "imported launcher_late while idle", timeout=20)
        assert _run(state_dir, str(tmp_path / "run.json")) == {"late_imported": True}
