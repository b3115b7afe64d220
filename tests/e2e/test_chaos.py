"""The chaos soak's short version (benchmarks/bench_chaos.py; issue 41, item 4): a 60-trial sweep run as a
deployment on the stack (PostgreSQL, a Dask worker on a second host) while a seeded driver restarts PostgreSQL,
SIGKILLs a Dask worker process, then the Prefect worker running the flow (and runs `sweepflow stack up`, as an
operator would). The run completes (or is completed by one `sweepflow run --resume`), every trial is recorded
exactly once in MLflow, Prefect and storage, and nothing is left running. The soak itself (500 trials, every kind of fault) is run by hand: benchmarks/RESULTS.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import paths
import pytest

BENCHMARKS = str(paths.ROOT / "benchmarks")
sys.path.insert(0, BENCHMARKS)

import bench_chaos  # noqa: E402 - its folder on sys.path first

# The faults each found a defect when the soak first ran: a refused database connection answered 500 by Prefect's
# server (a trial failed), a flow run that died with its worker, a busy worker replaced by `stack up`.
KINDS = ("prefect-worker", "dask-worker", "postgres")
SEED = (
    4  # their order: PostgreSQL at 9 s, a Dask worker at 24 s, the Prefect worker at 39 s (see the plan test)
)


def test_the_plan_is_seeded_spaced_and_goes_through_every_kind_before_repeating_one():
    plan = bench_chaos.plan_faults(SEED, 3, 50, gap_s=15, kinds=KINDS)
    assert [f.kind for f in plan] == ["postgres", "dask-worker", "prefect-worker"]
    assert plan == bench_chaos.plan_faults(SEED, 3, 50, gap_s=15, kinds=KINDS)
    long = bench_chaos.plan_faults(3, 14, 600)
    kinds = [f.kind for f in long]
    assert sorted(kinds[:6]) == sorted(bench_chaos.KINDS) and sorted(kinds[6:12]) == sorted(bench_chaos.KINDS)
    times = [f.at_s for f in long]
    assert times == sorted(times) and all(
        b - a >= bench_chaos.MIN_GAP_S - 0.1 for a, b in zip(times, times[1:], strict=False)
    )
    # A window too short for the gaps grows to hold them.
    assert bench_chaos.plan_faults(1, 4, 10, gap_s=15)[-1].at_s >= 45


def test_the_resumes_command_line_states_the_deployments_config():
    sets = bench_chaos.as_sets(bench_chaos.config(40, 8))
    assert (
        "sweep.num_samples=40" in sets and "training.max_failures=3" in sets and "training.epochs=8" in sets
    )
    assert any(s.startswith('sweep.search_space={"l1": {"type": "pow2"') for s in sets)


@pytest.mark.subprocess
@pytest.mark.stack
@pytest.mark.prefect
@pytest.mark.mlflow_server
@pytest.mark.dask
@pytest.mark.s3
@pytest.mark.postgres
def test_a_deployment_run_outlives_a_database_restart_and_its_dask_and_prefect_workers_killed(tmp_path):
    """The benchmark as a user runs it, in a process of its own (it sets Prefect's settings in its environment
    and owns the processes it starts)."""
    if (
        os.environ.get("SWEEPFLOW_SKIP_POSTGRES_TESTS") == "1"
        or os.environ.get("SWEEPFLOW_SKIP_NETNS_TESTS") == "1"
    ):
        pytest.skip("needs PostgreSQL and network namespaces")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test makes a network namespace: run it as root with iproute2 installed")
    argv = [
        sys.executable,
        os.path.join(BENCHMARKS, "bench_chaos.py"),
        # 60 trials: 28 s of sweep undisturbed at this machine's fastest (0.47 s a trial, seen 2026-12-01), so the
        # last fault (at 20.6 s of a 30-s window, 8 s apart: the Prefect worker, a Dask worker, PostgreSQL) lands
        # in it; 40 trials' 19 s once let the sweep end before the second fault.
        *("--num-samples", "60", "--faults", "3", "--seed", str(SEED), "--epochs", "8"),
        *("--window", "30", "--gap", "8", "--kinds", ",".join(KINDS), "--state-dir", str(tmp_path)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "SWEEPFLOW_"))}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    (tmp_path / "bench_chaos.log").write_text(output)  # kept by pytest for a look after the fact
    assert run.returncode == 0, output[-6000:]
    injected = re.findall(r"chaos t=\s*[\d.]+ s\s+(\S+)", run.stdout)
    assert injected == ["postgres", "dask-worker", "prefect-worker"], output[-3000:]
    assert "resumed with sweepflow run: False" in run.stdout, (
        "the run should complete by itself:\n" + output[-3000:]
    )
