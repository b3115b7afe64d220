"""A trial's system metrics (tasks/training/system_metrics.py): samples from the start of a short trial, a true
CPU reading of the process tree that burns CPU, and GPU metrics through `nvidia-smi` (a fake one first on PATH:
this machine has no GPU; the NVML path is not exercised here). The sampler hands its samples to rank 0's side
channel; here, to a list. How they reach the trial's MLflow run (after its first report, numbered across its
groups) is checked on real sweeps: test_pipeline.py, test_tracking_auth.py, test_multihost.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweepflow.tasks.training.system_metrics import TrialSampler, find_gpus, next_gap

BURN = "import time\nuntil = time.perf_counter() + {s}\nwhile time.perf_counter() < until: pass\n"


def _values(samples: list, name: str) -> list[float]:
    return [sample["system"][name] for sample in samples if name in sample["system"]]


def test_the_gaps_start_short_and_grow_to_the_longest_interval():
    assert next_gap(0.0, 5.0) == 0.5 and next_gap(1.0, 5.0) == 0.5
    assert next_gap(8.0, 5.0) == 2.0 and next_gap(60.0, 5.0) == 5.0
    assert next_gap(0.0, 0.2) == 0.2  # a longest interval below the first gap wins


def test_a_short_trial_gets_true_cpu_readings_from_its_start():
    """A process that burns a core, sampled for 1.2 s with the default longest interval (5 s): samples from its
    first half second on and one at the end, none of them the 0.0 of a first cpu_percent() call, each with the
    time it was taken."""
    samples: list = []
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(s=30)])
    try:
        began = time.time() * 1000
        sampler = TrialSampler(samples.append, max_interval_s=5.0, pid=burner.pid)
        sampler.start()
        time.sleep(1.2)
        assert sampler.stop(timeout_s=30)
    finally:
        burner.kill()
        burner.wait()
    process_cpu = _values(samples, "process_cpu_percentage")
    assert len(process_cpu) >= 2 and len(process_cpu) == len(samples) == sampler.samples  # 0.5 s, 1.0 s, the end
    assert all(value > 0 for value in process_cpu), process_cpu
    assert all(0 < value <= 100 for value in _values(samples, "cpu_utilization_percentage"))
    for name in ("system_memory_usage_megabytes", "process_memory_megabytes", "network_receive_megabytes"):
        assert len(_values(samples, name)) == len(samples), name
    times = [sample["time_ms"] for sample in samples]
    assert times == sorted(times) and began + 400 <= times[0] and times[-1] <= time.time() * 1000


def test_a_sampler_whose_channel_fails_stops_and_the_trial_goes_on():
    """The side channel raising (the driver gave the trial up): the sampler says so once and ends; its stop()
    returns at once."""
    calls = []

    def broken(payload):
        calls.append(payload)
        raise RuntimeError("the driver is gone")

    sampler = TrialSampler(broken, max_interval_s=0.1)
    sampler.start()
    time.sleep(0.5)
    assert sampler.stop(timeout_s=5) and len(calls) == 1 and sampler.samples == 0


def test_gpu_metrics_come_from_nvidia_smi_for_the_gpus_the_rank_sees(tmp_path, monkeypatch):
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
    samples: list = []
    sampler = TrialSampler(samples.append, max_interval_s=5.0)
    sampler.start()
    time.sleep(0.8)
    assert sampler.stop(timeout_s=30)

    metrics = samples[-1]["system"]
    assert metrics["gpu_1_utilization_percentage"] == 87
    assert metrics["gpu_1_memory_usage_megabytes"] == pytest.approx(2048 * 1.048576)
    assert metrics["gpu_1_memory_usage_percentage"] == pytest.approx(12.5)
    assert not [name for name in metrics if name.startswith("gpu_0_")]
    assert len(_values(samples, "gpu_1_utilization_percentage")) >= 2
    assert "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total" in calls.read_text()

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert find_gpus() is None  # no NVML, no nvidia-smi: no GPU metrics, no error
