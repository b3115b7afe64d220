"""Scripts as Ray's docs write them: ``TorchTrainer(...).fit()`` and ``tune.run`` / ``Tuner.fit`` at module level,
with no ``if __name__ == "__main__":`` guard, run as a file, with ``python -c``, piped to ``python -`` and to the
interactive ``python -i``, and in a Jupyter kernel.

Each runs in a fresh interpreter, as a user's does. The standalone trainer starts its own local cluster (no
Dask scheduler in the environment): its workers must not run the script again (they used to, and the nanny
failed to start), so the script's top level runs once, in the driver; the training function, defined in
``__main__``, reaches the workers by value."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.subprocess

#: Ray's getting-started shape, blank lines after blocks so that an interactive session reads it as written.
TRAIN_SCRIPT = textwrap.dedent(
    """
    import json, os
    import ddp_runtime as train
    from ddp_runtime import RunConfig, ScalingConfig
    from ddp_runtime.torch import TorchTrainer

    open(os.environ["MAIN_RUNS"], "a").write(f"{os.getpid()}\\n")

    def f(config):
        train.report({"x": 1, "rank": train.get_context().get_world_rank()})

    result = TorchTrainer(
        f,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=os.environ["STORAGE"], verbose=0),
    ).fit()
    print("RESULT " + json.dumps(result.metrics))
    """
)

#: What a standalone run must not inherit: a scheduler to connect to would make it skip its own local cluster.
_EXTERNAL = ("DASK_SCHEDULER_ADDRESS", "DASK_SCHEDULER__ADDRESS")


def _standalone_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _EXTERNAL}
    return {**env, "MAIN_RUNS": str(tmp_path / "main-runs"), "STORAGE": str(tmp_path / "results")}


def _command(mode: str, script: str) -> tuple[list[str], str | None]:
    """The command line and the stdin of ``script`` run as ``mode``."""
    if mode == "file":
        return [sys.executable, "train.py"], None
    if mode == "python -c":
        return [sys.executable, "-c", script], None
    if mode == "python -":
        return [sys.executable, "-"], script
    return [sys.executable, "-i"], script + "\n"  # "python -i": the REPL reading piped lines


def _result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if "RESULT " in line]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def _assert_main_ran_once(tmp_path, driver_pid: int | None = None) -> None:
    runs = (tmp_path / "main-runs").read_text().split()
    assert len(runs) == 1, f"the script's top level ran in {len(runs)} processes (workers re-ran it): {runs}"
    if driver_pid is not None:
        assert runs == [str(driver_pid)]


@pytest.mark.parametrize("mode", ["file", "python -c", "python -", "python -i"])
def test_a_torch_trainer_at_module_level_without_a_guard_runs(mode, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    command, stdin = _command(mode, TRAIN_SCRIPT)
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=_standalone_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its process group: the script, its cluster's nannies and workers
    )
    try:
        stdout, stderr = proc.communicate(stdin, timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and its workers, never left behind by a failed test
        stdout, stderr = proc.communicate()
        pytest.fail(f"{mode}: no result in 90 s:\n{stdout[-2000:]}{stderr[-4000:]}")
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]  # python -i exits 0 after an error too
    assert _result(stdout) == {"x": 1, "rank": 0, "training_iteration": 1}
    _assert_main_ran_once(tmp_path, proc.pid)
    print(f"{mode}: {time.monotonic() - started:.1f} s")


#: Runs a notebook's one cell in a Jupyter kernel (nbclient), then prints what the cell printed.
_NOTEBOOK_RUNNER = textwrap.dedent(
    """
    import sys, nbclient, nbformat
    notebook = nbformat.read(sys.argv[1], as_version=4)
    nbclient.NotebookClient(notebook, timeout=150, kernel_name="python3").execute()
    print("".join(o.get("text", "") for o in notebook.cells[0].outputs if o.get("name") == "stdout"))
    """
)


def _run_in_a_notebook(source: str, tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), str(tmp_path / "run.ipynb")
    )
    return subprocess.run(
        [sys.executable, "-c", _NOTEBOOK_RUNNER, "run.ipynb"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_torch_trainer_in_a_jupyter_kernel_runs(tmp_path):
    started = time.monotonic()
    proc = _run_in_a_notebook(TRAIN_SCRIPT, tmp_path, _standalone_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert _result(proc.stdout) == {"x": 1, "rank": 0, "training_iteration": 1}
    _assert_main_ran_once(tmp_path)
    print(f"jupyter: {time.monotonic() - started:.1f} s")


#: ``tune.run`` and ``Tuner.fit`` at module level, against the services in the environment (the test's).
TUNE_SCRIPT = textwrap.dedent(
    """
    import os
    from sweepflow import tune

    open(os.environ["MAIN_RUNS"], "a").write(f"{os.getpid()}\\n")

    def trainable(config):
        tune.report({"score": 2 * config["x"]})

    analysis = tune.run(trainable, config={"x": tune.grid_search([1.0, 2.0])}, metric="score", mode="max", verbose=0)
    print("RESULT tune.run", analysis.best_config["x"])
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([3.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(verbose=0),
    ).fit()
    print("RESULT Tuner.fit", grid.get_best_result().metrics["score"])
    """
)


@pytest.mark.parametrize("mode", ["file", "jupyter"])
def test_tune_run_and_tuner_fit_at_module_level_without_a_guard_run(mode, services, tmp_path):
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "tune_script.py").write_text(TUNE_SCRIPT)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "MAIN_RUNS": str(tmp_path / "main-runs")}
    started = time.monotonic()
    if mode == "jupyter":
        proc = _run_in_a_notebook(TUNE_SCRIPT, tmp_path, env)
    else:
        proc = subprocess.run(
            [sys.executable, "tune_script.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "RESULT tune.run 2.0" in proc.stdout and "RESULT Tuner.fit 6.0" in proc.stdout, proc.stdout[-3000:]
    _assert_main_ran_once(tmp_path)
    print(f"tune ({mode}): {time.monotonic() - started:.1f} s")
