"""A trial's system metrics (tasks/training/system_metrics.py) against a real `mlflow server`: samples from the
start of a short trial, a true CPU reading of the process tree that burns CPU, and GPU metrics through
`nvidia-smi` (a fake one first on PATH: this machine has no GPU; the NVML path is not exercised here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from sweepflow.tasks.training.system_metrics import TrialSampler, find_gpus, next_gap

BURN = "import time\nuntil = time.perf_counter() + {s}\nwhile time.perf_counter() < until: pass\n"


def _history(client: MlflowClient, run_id: str, name: str) -> list:
    return client.get_metric_history(run_id, f"system/{name}")


def test_the_gaps_start_short_and_grow_to_the_longest_interval():
    assert next_gap(0.0, 5.0) == 0.5 and next_gap(1.0, 5.0) == 0.5
    assert next_gap(8.0, 5.0) == 2.0 and next_gap(60.0, 5.0) == 5.0
    assert next_gap(0.0, 0.2) == 0.2  # a longest interval below the first gap wins


def test_a_short_trial_gets_true_cpu_readings_from_its_start(mlflow_server):
    """A process that burns a core, sampled for 1.2 s with the default longest interval (5 s): samples from its
    first half second on and one at the end, none of them the 0.0 of a first cpu_percent() call; a second
    sampler on the same run (a restarted group) continues the steps."""
    client = MlflowClient(mlflow_server)
    run_id = client.create_run(client.create_experiment(f"sysmetrics-{time.time_ns()}")).info.run_id
    client.log_metric(run_id, "val_accuracy", 0.5, step=0)  # the trial's first report
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(s=30)])
    try:
        sampler = TrialSampler(mlflow_server, run_id, max_interval_s=5.0, pid=burner.pid)
        sampler.start()
        time.sleep(1.2)
        assert sampler.stop(timeout_s=30)
    finally:
        burner.kill()
        burner.wait()
    process_cpu = _history(client, run_id, "process_cpu_percentage")
    assert len(process_cpu) >= 2, process_cpu  # 0.5 s, 1.0 s, ... and the last one
    assert all(m.value > 0 for m in process_cpu), [m.value for m in process_cpu]
    host_cpu = _history(client, run_id, "cpu_utilization_percentage")
    assert len(host_cpu) == len(process_cpu) and all(0 < m.value <= 100 for m in host_cpu)
    for name in ("system_memory_usage_megabytes", "process_memory_megabytes", "network_receive_megabytes"):
        assert len(_history(client, run_id, name)) == len(process_cpu), name
    assert sorted(m.step for m in process_cpu) == list(range(len(process_cpu)))

    again = TrialSampler(mlflow_server, run_id, max_interval_s=5.0)
    again.start()
    time.sleep(0.7)
    assert again.stop(timeout_s=30)
    steps = sorted(m.step for m in _history(client, run_id, "cpu_utilization_percentage"))
    assert steps == list(range(len(steps))) and len(steps) > len(process_cpu)


def test_nothing_is_written_before_the_trials_own_first_report(mlflow_server):
    """MLflow's compare view opens on the metric a run logged first: the samples wait for the trial's first
    report and then all go, numbered from 0; a trial that never reports still gets them at its end."""
    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment(f"sysfirst-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    sampler = TrialSampler(mlflow_server, run_id, max_interval_s=0.3)
    sampler.start()
    time.sleep(1.0)
    assert not client.get_run(run_id).data.metrics, "system metrics were written before the trial reported"
    client.log_metric(run_id, "best_val_accuracy", 0.5, step=0)
    time.sleep(0.8)
    assert sampler.stop(timeout_s=30)
    assert list(client.get_run(run_id).data.metrics)[0] == "best_val_accuracy"
    steps = sorted(m.step for m in _history(client, run_id, "cpu_utilization_percentage"))
    assert len(steps) >= 4 and steps == list(range(len(steps))), steps  # the held samples were not lost

    silent = client.create_run(experiment).info.run_id
    sampler = TrialSampler(mlflow_server, silent, max_interval_s=0.3)
    sampler.start()
    time.sleep(0.5)
    assert sampler.stop(timeout_s=30)
    assert _history(client, silent, "cpu_utilization_percentage")


def test_gpu_metrics_come_from_nvidia_smi_for_the_gpus_the_rank_sees(tmp_path, monkeypatch, mlflow_server):
    """Without NVML's Python binding, `nvidia-smi --query-gpu` (here a fake one first on PATH) gives each
    visible GPU's utilisation and memory; CUDA_VISIBLE_DEVICES=1 shows GPU 1 only."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'echo "0, GPU-aaaa, 5, 100, 16384"\n'
        'echo "1, GPU-bbbb, 87, 2048, 16384"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML's binding "not installed": nvidia-smi it is
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    client = MlflowClient(mlflow_server)
    run_id = client.create_run(client.create_experiment(f"gpumetrics-{time.time_ns()}")).info.run_id
    client.log_metric(run_id, "val_accuracy", 0.5, step=0)

    sampler = TrialSampler(mlflow_server, run_id, max_interval_s=5.0)
    sampler.start()
    time.sleep(0.8)
    assert sampler.stop(timeout_s=30)

    metrics = client.get_run(run_id).data.metrics
    assert metrics["system/gpu_1_utilization_percentage"] == 87
    assert metrics["system/gpu_1_memory_usage_megabytes"] == pytest.approx(2048 * 1.048576)
    assert metrics["system/gpu_1_memory_usage_percentage"] == pytest.approx(12.5)
    assert not [name for name in metrics if name.startswith("system/gpu_0_")]
    assert len(_history(client, run_id, "gpu_1_utilization_percentage")) >= 2
    assert "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total" in calls.read_text()

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert find_gpus() is None  # no NVML, no nvidia-smi: no GPU metrics, no error
