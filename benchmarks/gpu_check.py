"""The GPU check, for the first host with NVIDIA GPUs: every GPU path of ddp_runtime and the pipeline, each in
about a minute.

    .venv/bin/python benchmarks/gpu_check.py [--only NAME ...] [--timeout 300]
    make gpu-check

NEVER YET RUN ON A GPU: it was written on a CPU-only machine, against the documented signatures
(``ScalingConfig(use_gpu=True)``, ``prepare_model(model, parallel_strategy="fsdp")``, ``report(checkpoint=...)``
from every rank, ``ddp_runtime.collective``). Until a run of it is recorded in benchmarks/RESULTS.md, no GPU
path of sweepflow has run on a GPU. The first run is expected to find bugs: that is what it is for.

The checks (``--only`` takes their names), each in a process of its own:

- ``tutorial``: Ray Train's getting-started script as Ray writes it (a module-level ``TorchTrainer(...).fit()``,
  no ``__main__`` guard), ResNet-18 on 28x28 images, with ``ScalingConfig(num_workers=<every GPU>,
  use_gpu=True)``: no Dask client, so ``fit()`` starts its own local cluster; every rank on its own device.
- ``ddp-1gpu``: one rank on one GPU, in a 1-rank NCCL group of its own with DistributedDataParallel.
- ``ddp-all``: NCCL DDP on every GPU (``prepare_model``): the ranks' devices distinct, their parameters equal.
- ``fsdp``: ``prepare_model(parallel_strategy="fsdp")`` on every GPU, a ``torch.distributed.checkpoint`` saved
  from every rank through ``report``, the last rank killed, the group resumed from ``get_checkpoint()``: the
  loss goes on from where it was (on a 1-GPU host the model is not sharded: one rank).
- ``bf16``: ``torch.autocast("cuda", dtype=torch.bfloat16)`` in a rank (skipped where the GPU has no bf16).
- ``pipeline``: ``sweepflow run --no-server`` with its default configuration on GPUs
  (``resources.gpus_per_rank=1``, ``resources.ranks_per_trial`` at most the GPUs): nvidia-smi must see the
  GPUs' memory rise while it runs (its peak is nvidia-smi's ``memory.used``; the others' torch's peak allocated).

Prints a table (check, result, samples/s in a worker against plain PyTorch on the same GPU, peak GPU memory)
for benchmarks/RESULTS.md. Exit status: 0 every check passed (or was skipped), 1 one failed, 2 the host has no
NVIDIA GPU (said in one sentence).

``GPU_CHECK_ON_CPU=1`` rehearses the checks' own code on the CPU (gloo, two CPU ranks standing for two GPUs,
no pipeline): it says nothing about GPUs, only that this script is not broken before it reaches one
(tests/benchmarks/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
CHECKS = ("tutorial", "ddp-1gpu", "ddp-all", "fsdp", "bf16", "pipeline")
EXIT_NO_GPU = 2
ON_CPU = os.environ.get("GPU_CHECK_ON_CPU") == "1"  # the rehearsal (see above)
# Timed steps per measurement, untimed steps before them, images per step (the rehearsal's: a CPU's worth).
STEPS, WARMUP, BATCH = (12, 2, 16) if ON_CPU else (60, 5, 128)
BACKEND = "gloo" if ON_CPU else "nccl"


def nvidia_smi_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (none when it is missing or fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return (
        [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []
    )


def gpu_memory_used_mib() -> list[float]:
    """Every GPU's used memory, as nvidia-smi reports it (empty when it cannot)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [float(v) for v in out.stdout.split()] if out.returncode == 0 else []


# --- the work: the tutorial's model on synthetic 28x28 images whose labels it can learn ---------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: Any, *, reset: bool = False) -> float:
    """The device's peak allocated memory since the last reset (0 on the CPU); ``reset``: start again."""
    import torch

    if device.type != "cuda":
        return 0.0
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def device_id(device: Any) -> str:
    """Which physical device this is: the GPU's UUID (the process on the CPU)."""
    import torch

    if device.type != "cuda":
        return f"cpu-{os.getpid()}"
    return str(torch.cuda.get_device_properties(device).uuid)


def tutorial_model() -> Any:
    """Ray's getting-started model: ResNet-18 with a 1-channel first layer (a small CNN without torchvision)."""
    import torch

    try:
        from torchvision.models import resnet18
    except ImportError:
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(512, 10),
        )
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def batches(device: Any, n: int, seed: int = 0) -> list[tuple[Any, Any]]:
    """``n`` batches of noisy copies of ten fixed template images, labelled by their template: learnable in a
    few steps, so the loss must fall."""
    import torch

    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    out = []
    for _ in range(n):
        y = torch.randint(0, 10, (BATCH,), generator=g)
        x = templates[y] + 0.5 * torch.randn(BATCH, 1, 28, 28, generator=g)
        out.append((x.to(device), y.to(device)))
    return out


def timed_steps(model: Any, device: Any, *, bf16: bool = False, seed: int = 0) -> dict[str, float]:
    """Train ``WARMUP + STEPS`` steps; samples/s over the timed ones, first and last loss, peak memory."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(device, WARMUP + STEPS, seed)
    losses, dtypes = [], set()
    peak_mib(device, reset=True)
    for i, (x, y) in enumerate(data):
        if i == WARMUP:
            _sync(device)
            started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
            loss = loss_fn(out, y)
        dtypes.add(str(out.dtype))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    _sync(device)
    return {
        "samples_per_s": STEPS * BATCH / (time.perf_counter() - started),
        "loss_first": sum(losses[:5]) / 5,  # of the first and the last five steps
        "loss_last": sum(losses[-5:]) / 5,
        "peak_mib": peak_mib(device),
        "dtypes": ",".join(sorted(dtypes)),
    }


def plain(bf16: bool = False) -> dict[str, float]:
    """The same work in plain PyTorch on this process's first GPU: the baseline of the worker's samples/s."""
    import torch

    device = torch.device("cpu") if ON_CPU else torch.device("cuda", 0)
    return timed_steps(tutorial_model().to(device), device, bf16=bf16)


# --- training functions (run on the ranks; this folder is on the workers' PYTHONPATH) ------------------------


def _gathered(info: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return [info]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, info)
    return every


def ddp_fn(config: dict[str, Any]) -> None:
    """DDP on the rank's GPU; reports what every rank saw (device, backend, a parameter checksum)."""
    import torch
    import torch.distributed as dist

    import ddp_runtime as train
    from ddp_runtime.torch import get_device, prepare_model

    device = get_device()
    own_group = config.get("own_group") and train.get_context().get_world_size() == 1
    if own_group:  # a 1-rank NCCL group: the one way to run NCCL and DDP with a single GPU
        on_gpu = device.type == "cuda"
        backend, ids = ("nccl", [device.index]) if on_gpu else ("gloo", None)
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device if on_gpu else None
        )
        model = torch.nn.parallel.DistributedDataParallel(tutorial_model().to(device), device_ids=ids)
    else:
        model = prepare_model(tutorial_model())
    stats = timed_steps(model, device, bf16=config.get("bf16", False))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    ranks = _gathered(
        {
            "uuid": device_id(device),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "checksum": checksum,
            "peak_mib": stats["peak_mib"],
        }
    )
    if own_group:
        dist.destroy_process_group()
    train.report({**stats, "ranks": json.dumps(ranks)})


def fsdp_fn(config: dict[str, Any]) -> None:
    """FSDP, a distributed checkpoint from every rank per epoch, the last rank killed once after ``crash_at``."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import ddp_runtime as train
    from ddp_runtime.torch import get_device, prepare_model

    ctx, device = train.get_context(), get_device()
    torch.manual_seed(0)
    width = 256 if ON_CPU else 2048  # on a GPU ~50 MB of parameters: a model worth sharding
    model = torch.nn.Sequential(
        *[m for _ in range(3) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    )
    model = prepare_model(torch.nn.Sequential(model, torch.nn.Linear(width, 10)), parallel_strategy="fsdp")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start, resumed = 0, train.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=os.path.join(d, "dcp"))
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            with open(os.path.join(d, "epoch.json")) as f:
                start = json.load(f)["epoch"] + 1
    g = torch.Generator().manual_seed(ctx.get_world_rank())
    target = torch.randn(width, 10, generator=torch.Generator().manual_seed(7)).to(device)
    for epoch in range(start, config["epochs"]):
        peak_mib(device, reset=True)
        for _ in range(10 if ON_CPU else 20):
            x = torch.randn(64, width, generator=g).to(device)
            loss = torch.nn.functional.mse_loss(model(x), x @ target / width**0.5)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with tempfile.TemporaryDirectory() as d:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(d, "dcp"))
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, "epoch.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
            peak = _gathered({"peak_mib": peak_mib(device)})
            metrics = {"epoch": epoch, "loss": float(loss.detach()), "resumed": resumed is not None}
            # FSDP2 holds DTensor parameters, FSDP1 a FullyShardedDataParallel wrapper: either is sharded.
            metrics["sharded"] = type(model).__name__ == "FullyShardedDataParallel" or any(
                type(p).__name__ == "DTensor" for p in model.parameters()
            )
            train.report(
                {**metrics, "peak_mib": max(p["peak_mib"] for p in peak)},
                checkpoint=train.Checkpoint.from_directory(d),
            )
        marker = os.path.join(config["workdir"], "killed")
        if epoch == config["crash_at"] and ctx.get_world_rank() == ctx.get_world_size() - 1:
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # a rank killed, as by the OOM killer


# --- one check, in a process of its own --------------------------------------------------------------------


def _trainer(fn: Any, num_workers: int, workdir: str, config: dict[str, Any], **run: Any) -> Any:
    import ddp_runtime as train
    from ddp_runtime.torch import TorchTrainer

    return TorchTrainer(
        fn,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=num_workers, use_gpu=not ON_CPU),
        run_config=train.RunConfig(storage_path=os.path.join(workdir, "results"), **run),
    ).fit()


def _ddp_row(
    result: Any, ranks_wanted: int, backend_wanted: str | None, bf16: bool = False
) -> dict[str, Any]:
    m = result.metrics
    ranks = json.loads(m["ranks"])
    problems = []
    if len(ranks) != ranks_wanted:
        problems.append(f"{len(ranks)} ranks, wanted {ranks_wanted}")
    if len({r["uuid"] for r in ranks}) != len(ranks):
        problems.append(f"ranks share a device: {[r['uuid'] for r in ranks]}")
    if backend_wanted and any(r["backend"] != backend_wanted for r in ranks):
        problems.append(f"backends {[r['backend'] for r in ranks]}, wanted {backend_wanted}")
    if len({round(r["checksum"], 3) for r in ranks}) != 1:
        problems.append("the ranks' parameters differ after DDP")
    if not m["loss_last"] < m["loss_first"]:
        problems.append(f"loss did not fall ({m['loss_first']:.3f} -> {m['loss_last']:.3f})")
    if bf16 and "torch.bfloat16" not in m["dtypes"]:
        problems.append(f"autocast gave {m['dtypes']}, not bfloat16")
    base = plain(bf16=bf16)
    visible = ",".join(r["visible"] or "-" for r in ranks)
    return {
        "ok": not problems,
        "worker_sps": m["samples_per_s"],
        "plain_sps": base["samples_per_s"],
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "note": "; ".join(problems) or f"CUDA_VISIBLE_DEVICES per rank: {visible}",
    }


def check_tutorial(n_gpus: int, workdir: str) -> dict[str, Any]:
    script = os.path.join(workdir, "ray_getting_started.py")
    with open(script, "w") as f:
        f.write(
            TUTORIAL.format(num_workers=n_gpus, use_gpu=not ON_CPU, storage=os.path.join(workdir, "results"))
        )
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=workdir)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "note": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    got = json.loads(lines[-1][len("RESULT ") :])
    ok = got["checkpoint"] and got["devices"] == n_gpus
    return {
        "ok": ok,
        "worker_sps": got["samples_per_s"],
        "plain_sps": plain()["samples_per_s"],
        "peak_mib": got["peak_mib"],
        "note": f"{got['devices']} distinct device(s) for {n_gpus} rank(s); checkpoint {got['checkpoint']}",
    }


def check_fsdp(n_gpus: int, workdir: str) -> dict[str, Any]:
    import ddp_runtime as train

    result = _trainer(
        fsdp_fn,
        n_gpus,
        workdir,
        {"epochs": 4, "crash_at": 1, "workdir": workdir},
        failure_config=train.FailureConfig(max_failures=1),
    )
    history = result.metrics_history
    before = [h["loss"] for h in history if not h["resumed"]]
    after = [h["loss"] for h in history if h["resumed"]]
    ok = result.error is None and os.path.exists(os.path.join(workdir, "killed")) and bool(before and after)
    # Resumed, the first epoch replays epoch 0's inputs: from a reset model its loss would be epoch 0's again.
    ok = ok and after[0] < 0.99 * before[0] and history[-1]["epoch"] == 3
    with result.checkpoint.as_directory() as d:  # every rank's shard file, merged into one checkpoint
        shards = len([f for f in os.listdir(os.path.join(d, "dcp")) if f.endswith(".distcp")])
    sharded = all(h["sharded"] for h in history)
    ok = ok and shards == n_gpus and (sharded or n_gpus == 1)
    return {
        "ok": ok,
        "peak_mib": max(h["peak_mib"] for h in history),
        "note": f"{n_gpus} rank(s), sharded {sharded}, {shards} shard file(s); loss "
        f"{' '.join(f'{v:.4f}' for v in before)}, a rank killed, resumed: "
        f"{' '.join(f'{v:.4f}' for v in after)}" + ("" if n_gpus > 1 else " (1 GPU: not sharded)"),
    }


def check_pipeline(n_gpus: int, workdir: str) -> dict[str, Any]:
    sets = [
        "resources.gpus_per_rank=1",
        f"resources.ranks_per_trial={min(2, n_gpus)}",
        f"state_dir={workdir}",
    ]
    cmd = [os.path.join(os.path.dirname(sys.executable), "sweepflow"), "run", "--no-server"]
    cmd += ["--summary-json", os.path.join(workdir, "summary.json")]
    for item in sets:
        cmd += ["--set", item]
    idle = max(gpu_memory_used_mib() or [0.0])
    peak, done = [idle], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak.append(max(gpu_memory_used_mib() or [0.0]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    used = max(peak) - idle
    ok = proc.returncode == 0 and used > 100
    why = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}" if proc.returncode else ""
    return {
        "ok": ok,
        "peak_mib": max(peak),
        "note": why
        or f"{wall:.0f} s; GPU memory rose {used:.0f} MiB above idle"
        + ("" if used > 100 else " (no GPU use?)"),
    }


def child(name: str, n_gpus: int, workdir: str) -> dict[str, Any]:
    """Run one check here (a process of its own: its CUDA context and local cluster go with it)."""
    import torch

    if name == "tutorial":
        return check_tutorial(n_gpus, workdir)
    if name == "ddp-1gpu":
        return _ddp_row(_trainer(ddp_fn, 1, workdir, {"own_group": True}), 1, BACKEND)
    if name == "ddp-all":
        return _ddp_row(_trainer(ddp_fn, n_gpus, workdir, {}), n_gpus, BACKEND if n_gpus > 1 else None)
    if name == "fsdp":
        return check_fsdp(n_gpus, workdir)
    if name == "bf16":
        if not ON_CPU and not torch.cuda.is_bf16_supported():
            return {"ok": None, "note": f"{torch.cuda.get_device_name(0)} has no bfloat16: skipped"}
        return _ddp_row(_trainer(ddp_fn, 1, workdir, {"bf16": True}), 1, None, bf16=True)
    if name == "pipeline":
        return check_pipeline(n_gpus, workdir)
    raise ValueError(f"no check {name!r}; the checks: {', '.join(CHECKS)}")


#: Ray Train's getting-started script (docs: "Get started with PyTorch"): its shape and calls, as Ray writes
#: them, imports changed to ddp_runtime; synthetic images instead of FashionMNIST (no download).
TUTORIAL = """\
import json, os, tempfile
import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
import ddp_runtime as train
from ddp_runtime import Checkpoint, RunConfig, ScalingConfig
from ddp_runtime.torch import TorchTrainer, prepare_model
from gpu_check import device_id, timed_steps, tutorial_model


def train_func():
    model = prepare_model(tutorial_model())
    device = train.get_context().get_device()
    stats = timed_steps(model, device)
    uuid = device_id(device)
    every = [None] * train.get_context().get_world_size()
    if torch.distributed.is_initialized():
        torch.distributed.all_gather_object(every, uuid)
    else:
        every = [uuid]
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
        torch.save(state, os.path.join(temp_checkpoint_dir, "model.pt"))
        train.report(
            {{**stats, "devices": len(set(every))}},
            checkpoint=Checkpoint.from_directory(temp_checkpoint_dir),
        )


scaling_config = ScalingConfig(num_workers={num_workers}, use_gpu={use_gpu})
trainer = TorchTrainer(train_func, scaling_config=scaling_config, run_config=RunConfig(storage_path={storage!r}))
result = trainer.fit()
with result.checkpoint.as_directory() as checkpoint_dir:
    loaded = os.path.exists(os.path.join(checkpoint_dir, "model.pt"))
print("RESULT " + json.dumps({{**result.metrics, "checkpoint": loaded}}))
"""


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.0f}{unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=CHECKS, help="run these checks only")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per check (the pipeline: 3x)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        row = child(args.child, args.gpus, args.workdir)
        print("ROW " + json.dumps(row))
        return 0

    if ON_CPU:
        return run_checks([c for c in args.only or CHECKS if c != "pipeline"], 2, args.timeout)
    listed = nvidia_smi_gpus()
    if not listed:
        print(
            "gpu_check: this host has no NVIDIA GPU (nvidia-smi is missing or lists none), so there is nothing to check."
        )
        return EXIT_NO_GPU
    import torch

    n_gpus = torch.cuda.device_count()
    if n_gpus == 0:
        print(
            f"gpu_check: FAIL: nvidia-smi lists {len(listed)} GPU(s) but torch {torch.__version__} sees none "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); install a CUDA build of torch "
            "that matches the driver."
        )
        return 1
    print(f"{n_gpus} GPU(s): {'; '.join(listed)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    return run_checks(args.only or list(CHECKS), n_gpus, args.timeout)


def run_checks(names: list[str], n_gpus: int, timeout_s: float) -> int:
    """Each check in a child process; prints a line per check as it ends, then the table. The exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH_DIR, env.get("PYTHONPATH")) if p)
    rows = []
    for name in names:
        workdir = tempfile.mkdtemp(prefix=f"gpu-check-{name}-")
        code = "import sys, gpu_check; sys.exit(gpu_check.main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", code, "--child", name, "--gpus", str(n_gpus), "--workdir", workdir]
        timeout = timeout_s * (3 if name == "pipeline" else 1)
        started = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=workdir)
            found = [line for line in proc.stdout.splitlines() if line.startswith("ROW ")]
            row = (
                json.loads(found[-1][4:])
                if found
                else {"ok": False, "note": (proc.stderr or proc.stdout).strip()[-300:]}
            )
        except subprocess.TimeoutExpired:
            row = {"ok": False, "note": f"still running after {timeout:g} s"}
        row.update(check=name, seconds=time.perf_counter() - started)
        rows.append(row)
        verdict = {True: "pass", False: "FAIL", None: "skip"}[row["ok"]]
        print(f"{name}: {verdict} in {row['seconds']:.0f} s: {row.get('note', '')}", flush=True)
        if row["ok"] is not False:
            shutil.rmtree(workdir, ignore_errors=True)  # a failed check's files stay, for a look

    print("\n| check | result | s | samples/s in a worker | samples/s plain PyTorch | peak GPU MiB | note |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "skip"}[r["ok"]]
        print(
            f"| {r['check']} | {verdict} | {r['seconds']:.0f} | {_fmt(r.get('worker_sps'))} | "
            f"{_fmt(r.get('plain_sps'))} | {_fmt(r.get('peak_mib'))} | {r.get('note', '').replace('|', '/')} |"
        )
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
