"""benchmarks/gpu_check.py where there is no GPU: it says so in one sentence and exits 2 (its checks themselves
need NVIDIA GPUs and have never run; see its docstring)."""

from __future__ import annotations

import os
import subprocess
import sys

import paths
import pytest

ROOT = str(paths.ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def _run(path: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PATH"}
    environ.update(PATH=path, **env)
    return subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, env=environ, timeout=120)


@pytest.mark.subprocess
def test_a_host_without_an_nvidia_gpu_is_told_so_in_one_sentence_and_exits_2(tmp_path):
    proc = _run(str(tmp_path))  # no nvidia-smi on PATH
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "has no NVIDIA GPU" in lines[0] and lines[0].endswith("."), proc.stdout
    assert not proc.stderr


@pytest.mark.subprocess
def test_gpus_that_torch_cannot_see_are_a_failure_not_a_gpu_less_host(tmp_path):
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text(
        '#!/bin/sh\necho "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n'
    )
    stand_in.chmod(0o755)
    proc = _run(f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nvidia-smi lists 1 GPU(s) but torch" in proc.stdout and "CUDA build of torch" in proc.stdout


def test_the_checks_named_in_the_docstring_are_the_ones_it_runs():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import gpu_check
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    doc = gpu_check.__doc__
    assert "NEVER YET RUN ON A GPU" in doc
    for name in gpu_check.CHECKS:
        assert f"``{name}``" in doc, name
    compile(gpu_check.TUTORIAL.format(num_workers=2, use_gpu=True, storage="/tmp/x"), "tutorial", "exec")


@pytest.mark.dask
@pytest.mark.subprocess
def test_the_checks_code_rehearsed_on_the_cpu_passes(tmp_path):
    """GPU_CHECK_ON_CPU=1: the FSDP check (a distributed checkpoint from both ranks, a rank killed, the resume), on
    two CPU ranks with gloo. Nothing about GPUs: only that the script's own code works up to the devices. (The
    other checks rehearse the same way, by hand: ``GPU_CHECK_ON_CPU=1 python benchmarks/gpu_check.py``.)"""
    environ = dict(os.environ, GPU_CHECK_ON_CPU="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--only", "fsdp"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[:2] for r in rows[1:]] == [["| fsdp", "pass"]], proc.stdout
    assert "2 shard file(s)" in proc.stdout and "sharded True" in proc.stdout
