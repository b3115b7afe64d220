"""The warm launcher (``sweepflow.infra.services.launcher``): what it imports before it is ready and what once idle.

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

from sweepflow.infra.services import launcher

pytestmark = pytest.mark.subprocess


@contextlib.contextmanager
def serving(state_dir: str, *, idle_seconds: float) -> Iterator[tuple[psutil.Process, str]]:
    """A launcher for ``launcher_entry:main`` that imports ``launcher_late`` when idle; (process, its log)."""
    os.makedirs(os.path.join(state_dir, "services"), exist_ok=True)
    ready = os.path.join(state_dir, "services", "launcher.ready")
    log = os.path.join(state_dir, "launcher.log")
    code = (
        "import sys\nfrom sweepflow.infra.services.launcher import serve\n"
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
    assert launcher.run(state_dir, [out, str(sleep)], handover={}) == 0
    with open(out) as f:
        seen = json.load(f)
    assert seen.pop("handover") == {}
    return seen


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


def test_the_handover_reaches_the_entry_and_never_the_launchers_log(tmp_path):
    """What a command hands its child beside its arguments (``sweepflow run``: when it started, its ``--set``
    values, which may hold credentials) reaches the entry as its second argument, as sent; the launcher logs the
    arguments of each run it starts, never the handover."""
    state_dir = str(tmp_path)
    secret = "s3cr3t-value-1f9a"
    handover = {"started_at": 1234.5, "sets": [f"data.source=http://user:{secret}@127.0.0.1:8000/x"]}
    with serving(state_dir, idle_seconds=60) as (_, log):
        out = str(tmp_path / "run.json")
        assert launcher.run(state_dir, [out, "0"], handover=handover) == 0
        with open(out) as f:
            assert json.load(f)["handover"] == handover
        _wait_for_line(log, "exit 0")
        text = open(log).read()
    assert f"sweepflow {out} 0" in text, text  # the run is logged, by its arguments
    assert secret not in text and "1234.5" not in text, text
