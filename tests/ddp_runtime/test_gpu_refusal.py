"""``ScalingConfig(use_gpu=True)`` on a machine without GPUs and without a Dask cluster: refused in one sentence
before any worker starts (it used to start the workers, fail every rank on CUDA, restart them: 26-110 s).

Run as a user's script runs it, in a fresh interpreter: in the test process another test's Dask client may be
the default one, and a trainer uses that cluster (which refuses a GPU group it cannot hold, also before work)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ddp_runtime.cluster import gpu_count

SCRIPT = textwrap.dedent(
    """
    import json, time
    import psutil
    from ddp_runtime import ScalingConfig
    from ddp_runtime.torch import TorchTrainer

    def never_runs(config):
        raise AssertionError("a rank ran")

    trainer = TorchTrainer(never_runs, scaling_config=ScalingConfig(num_workers=2, use_gpu=True))
    started = time.monotonic()
    try:
        trainer.fit()
    except RuntimeError as exc:
        children = psutil.Process().children(recursive=True)
        print(json.dumps({"error": str(exc), "seconds": time.monotonic() - started, "children": len(children)}))
    """
)


@pytest.mark.subprocess
@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_use_gpu_without_a_gpu_or_a_cluster_is_refused_before_any_worker_starts():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert "no GPU" in outcome["error"] and "set use_gpu=False" in outcome["error"], outcome
    assert "\n" not in outcome["error"]
    assert outcome["seconds"] < 5 and outcome["children"] == 0, outcome  # no worker started
