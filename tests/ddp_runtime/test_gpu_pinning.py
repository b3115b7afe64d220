"""One GPU per rank, on this CPU machine: a stand-in ``nvidia-smi`` on PATH lists 4 GPUs, and what is checked is
the placement (each worker's ``CUDA_VISIBLE_DEVICES`` and ``GPU`` resource, each rank's worker), never CUDA:
the ranks train on gloo/CPU and ask for GPUs as a resource (``resources_per_worker={"GPU": 1}``), which is
how ``use_gpu=True`` places them.

The standalone trainer (no Dask client: it starts ``local_cluster``) and the Tune/pipeline cluster
(``cluster_client(None, use_gpu=True)``) both pin their workers here; ``use_gpu=True`` with no GPU at all is
refused before any worker starts (tests/ddp_runtime/test_gpu_refusal.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ddp_runtime import _gpus
from ddp_runtime.cluster import cluster_client, max_concurrent_groups
from ddp_runtime.config import RunConfig, ScalingConfig

STAND_IN = """#!/bin/sh
# A stand-in for `nvidia-smi -L` on a host with 4 GPUs (tests/ddp_runtime/test_gpu_pinning.py).
for i in 0 1 2 3; do
  echo "GPU $i: NVIDIA Stand-in 80GB (UUID: GPU-0000000$i-aaaa-bbbb-cccc-00000000000$i)"
done
"""


@pytest.fixture
def four_gpus(tmp_path_factory, monkeypatch):
    """This process (and what it starts) sees 4 GPUs through the stand-in ``nvidia-smi``; no GPU selection set."""
    bin_dir = tmp_path_factory.mktemp("stand-in-bin")
    exe = bin_dir / "nvidia-smi"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return bin_dir


# ------------------------------------------------------------------------------------------------ host's GPUs


def test_the_host_gpus_and_each_workers_own(four_gpus, monkeypatch):
    assert _gpus.visible_gpus() == ["0", "1", "2", "3"] and _gpus.gpu_count() == 4
    assert _gpus.pins(4, ["0", "1", "2", "3"]) == ["0", "1", "2", "3"]
    assert _gpus.pins(6, ["0", "1", "2", "3"]) == ["0", "1", "2", "3", "", ""]  # the rest see none
    assert _gpus.pins(2, ["0", "1", "2", "3"], per_worker=2) == ["0,1", "2,3"]
    assert _gpus.worker_environment("2") == {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # The parent's selection narrows them, in its order, up to the first entry that names no listed GPU.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-00000001,7,3")
    assert _gpus.visible_gpus() == ["2", "GPU-00000001"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _gpus.gpu_count() == 0


def test_ranks_that_would_share_a_gpu_are_refused_in_one_sentence_naming_the_field():
    with pytest.raises(ValueError) as refused:
        _gpus.check_room(2, {"GPU": 0.5}, ["0"])
    message = str(refused.value)
    assert "num_workers=2" in message and "resources_per_worker={'GPU': 0.5}" in message, message
    assert "never share a device" in message and "lower num_workers to 1" in message, message
    assert "\n" not in message and message.count(". ") == 0, message
    assert isinstance(refused.value, _gpus.InsufficientResourcesError)
    assert _gpus.check_room(2, {"GPU": 0.5}, ["0", "1"]) == 1  # on distinct devices: placed
    assert _gpus.check_room(2, {"GPU": 2}, ["0", "1", "2", "3"]) == 2
    with pytest.raises(ValueError, match=r"resources_per_worker=\{'GPU': 1.5\}.*whole number"):
        _gpus.gpus_per_worker({"GPU": 1.5})


# ---------------------------------------------------------------------------------------------- on a cluster

ARRIVALS_TIMEOUT_S = 60.0


def where_am_i(config):
    """A rank that writes where it runs (``<trial>-<rank>.json`` in ``arrivals``), then waits until every rank of
    every trial of the test has arrived: the trials run at the same time, on the host's GPUs all at once."""
    import ddp_runtime as train

    ctx = train.get_context()
    arrivals = Path(config["arrivals"])
    seen = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": [str(d) for d in train.get_devices()],
        "pid": os.getpid(),
    }
    (arrivals / f"{config['trial']}-{ctx.get_world_rank()}.json").write_text(json.dumps(seen))
    deadline = time.monotonic() + ARRIVALS_TIMEOUT_S
    while len(list(arrivals.iterdir())) < config["ranks"] and time.monotonic() < deadline:
        time.sleep(0.05)
    train.report({"all_arrived": len(list(arrivals.iterdir())) >= config["ranks"]})


def _arrived(arrivals: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(arrivals.glob("*.json"))}


def _fit(
    client, trial: str, ranks: int, total: int, arrivals: Path, storage: Path, out: dict, gpu: float = 1.0
) -> None:
    from ddp_runtime.torch import TorchTrainer

    trainer = TorchTrainer(
        where_am_i,
        train_loop_config={"trial": trial, "arrivals": str(arrivals), "ranks": total},
        scaling_config=ScalingConfig(num_workers=ranks, resources_per_worker={"GPU": gpu}),
        run_config=RunConfig(name=trial, storage_path=str(storage), verbose=0),
        client=client,
    )
    out[trial] = trainer.fit()


def _worker_pins(client) -> dict[str, tuple[str | None, float]]:
    env = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    gpus = {
        a: w["resources"].get("GPU", 0.0) for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
    }
    return {address: (env[address], gpus[address]) for address in env}


@pytest.mark.dask
def test_the_tune_cluster_pins_one_gpu_per_worker_and_packs_a_2_gpu_and_two_1_gpu_trials(four_gpus, tmp_path):
    started = time.monotonic()
    with cluster_client(None, use_gpu=True) as client:  # what tune.run / the pipeline start with use_gpu
        client.wait_for_workers(4, timeout=120)
        pins = _worker_pins(client)
        print(f"4 pinned workers up in {time.monotonic() - started:.1f} s")
        assert sorted(pin for pin, _ in pins.values()) == ["0", "1", "2", "3"], pins  # one distinct GPU each
        assert {gpu for _, gpu in pins.values()} == {1.0}, pins
        assert set(client.run(lambda: os.environ.get("CUDA_DEVICE_ORDER")).values()) == {"PCI_BUS_ID"}
        one, two = (
            ScalingConfig(resources_per_worker={"GPU": 1}),
            ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
        )
        assert (max_concurrent_groups(client, one), max_concurrent_groups(client, two)) == (4, 2)

        arrivals, results = tmp_path / "arrivals", {}
        arrivals.mkdir()
        shapes = {"trial-2gpu": 2, "trial-1gpu-a": 1, "trial-1gpu-b": 1}
        threads = [
            threading.Thread(target=_fit, args=(client, t, n, 4, arrivals, tmp_path / "results", results))
            for t, n in shapes.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
        assert set(results) == set(shapes), results
        # Half a GPU per rank: the group's two ranks still on two workers, two devices.
        halves = tmp_path / "halves"
        halves.mkdir()
        _fit(client, "trial-half", 2, 2, halves, tmp_path / "results", results, gpu=0.5)

    ranks = _arrived(arrivals)  # "<trial>-<rank>" -> where it ran
    print("worker -> (CUDA_VISIBLE_DEVICES, GPU):", json.dumps(pins))
    print(
        "trial-rank -> CUDA_VISIBLE_DEVICES:",
        json.dumps({k: v["cuda_visible_devices"] for k, v in ranks.items()}),
    )
    assert all(r.metrics["all_arrived"] for r in results.values()), ranks  # all 4 ranks ran at once
    assert sorted(ranks) == ["trial-1gpu-a-0", "trial-1gpu-b-0", "trial-2gpu-0", "trial-2gpu-1"], ranks
    used = [r["cuda_visible_devices"] for r in ranks.values()]
    assert sorted(used) == ["0", "1", "2", "3"], ranks  # the 4-GPU host packed, no GPU shared
    assert len({r["pid"] for r in ranks.values()}) == 4, ranks  # each rank in a worker process of its own
    assert all(r["devices"] == ["cpu"] for r in ranks.values()), ranks  # use_gpu=False: gloo on the CPU
    half = _arrived(halves)
    print(
        "trial-half ({'GPU': 0.5} per rank) -> CUDA_VISIBLE_DEVICES:",
        json.dumps({k: v["cuda_visible_devices"] for k, v in half.items()}),
    )
    assert sorted(half) == ["trial-half-0", "trial-half-1"], half
    assert len({r["cuda_visible_devices"] for r in half.values()}) == 2, half


STANDALONE = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    import ddp_runtime as train
    from ddp_runtime import RunConfig, ScalingConfig
    from ddp_runtime.torch import TorchTrainer

    def f(config):
        rank = train.get_context().get_world_rank()
        with open(os.path.join(sys.argv[2], f"rank-{rank}"), "w") as out:
            out.write(os.environ["CUDA_VISIBLE_DEVICES"])
        train.report({"rank": rank})

    def fit(**scaling):
        return TorchTrainer(
            f, scaling_config=ScalingConfig(**scaling), run_config=RunConfig(storage_path=sys.argv[1], verbose=0)
        ).fit()

    os.environ["CUDA_VISIBLE_DEVICES"] = "3"  # one GPU for this process: two ranks cannot each have one
    started = time.monotonic()
    try:
        fit(num_workers=2, resources_per_worker={"GPU": 0.5})
    except ValueError as exc:
        print("REFUSED " + json.dumps({"error": str(exc), "seconds": time.monotonic() - started,
                                      "children": len(psutil.Process().children(recursive=True))}))
    del os.environ["CUDA_VISIBLE_DEVICES"]
    started = time.monotonic()
    fit(num_workers=2, resources_per_worker={"GPU": 1})
    print("RANKS " + json.dumps({"seconds": time.monotonic() - started}))
    """
)


@pytest.mark.subprocess
def test_a_standalone_trainer_gives_each_of_its_2_ranks_a_gpu_of_its_own(four_gpus, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", STANDALONE, str(tmp_path / "results"), str(ranks_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
        for line in proc.stdout.splitlines()
        if " {" in line
    }
    refused = lines["REFUSED"]
    assert (
        "resources_per_worker={'GPU': 0.5}" in refused["error"] and "never share a device" in refused["error"]
    )
    assert refused["children"] == 0 and refused["seconds"] < 5, refused  # before any worker started
    pins = {p.name: p.read_text() for p in sorted(ranks_dir.iterdir())}
    print(
        "standalone 2-rank trial, rank -> CUDA_VISIBLE_DEVICES:",
        json.dumps(pins),
        f"({lines['RANKS']['seconds']:.1f} s)",
    )
    assert sorted(pins) == ["rank-0", "rank-1"] and sorted(pins.values()) == ["0", "1"], pins  # one GPU each
