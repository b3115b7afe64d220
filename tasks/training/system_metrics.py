"""A trial's system metrics, sampled on its rank 0 while it trains and written to its MLflow run as ``system/...``.

What MLflow's own ``SystemMetricsMonitor`` gave a sweep's trials was thin: its first sample comes a whole interval
(5 s by default) after the start, so most short trials had none; its CPU reading is ``psutil.cpu_percent()``,
whose first call returns 0.0; and it is the host's CPU, not the trial's. Here, one thread per trial:

- samples from the moment the training function starts: after 0.5 s, then at gaps that grow with the trial's
  age (a quarter of it) up to ``max_interval_s``, and once more when the function ends, so a trial of a second
  or more ends with at least two samples of every metric;
- reads CPU as the change in CPU times since the previous sample (no first-call zero): the host's
  (``system/cpu_utilization_percentage``, 0-100 over all its cores, MLflow's name) and the trial's own
  processes' (``system/process_cpu_percentage``: the Dask worker process running rank 0 and its children, e.g.
  DataLoader workers; 100 = one core busy, as ``top`` shows it);
- reads memory: the host's (MLflow's names) and the trial's processes' resident set
  (``system/process_memory_megabytes``; pages they share count once per process), and the host's disk and
  network as MLflow does;
- reads each GPU the rank can see (``CUDA_VISIBLE_DEVICES``) where there is one:
  ``system/gpu_<i>_utilization_percentage``, ``..._memory_usage_megabytes``, ``..._memory_usage_percentage``
  (``<i>``: its index as ``nvidia-smi`` shows it), through NVML (``pynvml``) when it loads, else one
  ``nvidia-smi`` call per sample;
- hands each sample to rank 0's side channel to the sweep (``ddp_runtime.session.side_channel``): it travels
  with the trial's next report (no request of its own) and the sweep writes it to the trial's MLflow run, after
  the trial's first report (MLflow's compare view opens its parallel-coordinates plot on the metric a run logged
  first, which must be the trial's best value, not the CPU) and numbered on from the run's earlier system
  metrics (a restarted group continues the steps). The ranks never talk to the tracking server for them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil

log = logging.getLogger(__name__)

FIRST_SAMPLE_S = 0.5  # the first sample, after the function starts (sooner when max_interval_s is shorter)
LAST_SAMPLE_MIN_S = 0.1  # the sample at the end is taken when at least this long has passed since the last one
NVIDIA_SMI_QUERY = "index,uuid,utilization.gpu,memory.used,memory.total"
_MIB = 1024 * 1024 / 1e6  # nvidia-smi's MiB in MB (MLflow's system metrics are in MB)


def next_gap(age_s: float, max_interval_s: float) -> float:
    """Seconds to the next sample of a trial ``age_s`` seconds old: a quarter of its age, at least the first
    gap and at most ``max_interval_s`` (short trials get samples, long ones are not flooded)."""
    first = min(FIRST_SAMPLE_S, max_interval_s)
    return min(max(age_s / 4.0, first), max_interval_s)


class _CpuClock:
    """CPU seconds of the host and of one process tree, read now and compared with the last reading."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.last = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        """(wall, host busy, host total, tree CPU seconds) now; the tree's resident memory is kept aside."""
        host = psutil.cpu_times()
        total = sum(host) - getattr(host, "guest", 0.0) - getattr(host, "guest_nice", 0.0)  # in user/nice already
        busy = total - host.idle - getattr(host, "iowait", 0.0)
        tree, self.rss = 0.0, 0
        processes = [self.root]
        try:
            processes += self.root.children(recursive=True)
        except psutil.Error:
            pass
        self.alive = True
        for process in processes:
            try:
                with process.oneshot():
                    times, memory = process.cpu_times(), process.memory_info()
            except psutil.Error:  # ended meanwhile: its time moves to its parent's children_* once reaped
                self.alive = self.alive and process is not self.root
                continue
            tree += times.user + times.system + times.children_user + times.children_system
            self.rss += memory.rss
        return time.monotonic(), busy, total, tree

    def sample(self) -> dict[str, float]:
        now = self._read()
        wall, busy, total, tree = (a - b for a, b in zip(now, self.last, strict=True))
        self.last = now
        out = {}
        if total > 0:
            out["cpu_utilization_percentage"] = max(0.0, min(100.0, 100.0 * busy / total))
        if self.alive:  # else the process ended: nothing to say about it
            out["process_memory_megabytes"] = self.rss / 1e6
            if wall > 0:
                out["process_cpu_percentage"] = max(0.0, 100.0 * tree / wall)
        return out


def _host_memory_disk_network(net_start: Any) -> dict[str, float]:
    memory = psutil.virtual_memory()
    out = {
        "system_memory_usage_megabytes": memory.used / 1e6,
        "system_memory_usage_percentage": memory.used / memory.total * 100,
    }
    try:
        disk = psutil.disk_usage("/")
        out.update(
            disk_usage_percentage=disk.percent,
            disk_usage_megabytes=disk.used / 1e6,
            disk_available_megabytes=disk.free / 1e6,
        )
    except OSError:
        pass
    if net_start is not None:
        net = psutil.net_io_counters()
        out.update(
            network_receive_megabytes=(net.bytes_recv - net_start.bytes_recv) / 1e6,
            network_transmit_megabytes=(net.bytes_sent - net_start.bytes_sent) / 1e6,
        )
    return out


# ------------------------------------------------------------------------------------------------------ GPUs


class GpuReader(Protocol):
    def read(self) -> dict[str, float]: ...


def _visible(index: int, uuid: str, visible: str | None) -> bool:
    """Whether the GPU with this index and UUID is one ``CUDA_VISIBLE_DEVICES`` shows (None: all are)."""
    if visible is None:
        return True
    for entry in (e.strip() for e in visible.split(",")):
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:
                return False  # CUDA stops at an invalid entry
            if int(entry) == index:
                return True
        elif entry.startswith("GPU-") and uuid.startswith(entry):
            return True
        elif entry.startswith("MIG-"):
            return True  # a MIG slice: its parent GPU's numbers are the closest there are
    return False


def _gpu_metrics(index: str, utilization: float | None, used_mb: float | None, total_mb: float | None) -> dict:
    out = {}
    if utilization is not None:
        out[f"gpu_{index}_utilization_percentage"] = utilization
    if used_mb is not None:
        out[f"gpu_{index}_memory_usage_megabytes"] = used_mb
        if total_mb:
            out[f"gpu_{index}_memory_usage_percentage"] = used_mb / total_mb * 100
    return out


class _NvmlGpus:
    def __init__(self, nvml: Any, handles: list[tuple[int, Any]]) -> None:
        self.nvml, self.handles = nvml, handles

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for index, handle in self.handles:
            try:
                utilization = float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except self.nvml.NVMLError:
                utilization = None
            try:
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                used, total = memory.used / 1e6, memory.total / 1e6
            except self.nvml.NVMLError:
                used = total = None
            out.update(_gpu_metrics(str(index), utilization, used, total))
        return out


def _nvml_gpus(visible: str | None) -> GpuReader | None:
    try:
        import pynvml

        pynvml.nvmlInit()  # reference-counted by NVML: once per trial is fine
        handles = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            if _visible(index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), visible):
                handles.append((index, handle))
    except Exception:  # noqa: BLE001 - not installed, no driver, no device: try nvidia-smi
        return None
    return _NvmlGpus(pynvml, handles) if handles else None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class _SmiGpus:
    """One ``nvidia-smi --query-gpu`` call per sample (where NVML's Python binding is not installed)."""

    def __init__(self, path: str, visible: str | None) -> None:
        self.path, self.visible = path, visible

    def read(self) -> dict[str, float]:
        try:
            done = subprocess.run(
                [self.path, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if done.returncode != 0:
            return {}
        out: dict[str, float] = {}
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) < 5 or not fields[0].isdigit() or not _visible(int(fields[0]), fields[1], self.visible):
                continue
            used, total = _number(fields[3]), _number(fields[4])
            out.update(
                _gpu_metrics(
                    fields[0],
                    _number(fields[2]),
                    used * _MIB if used is not None else None,
                    total * _MIB if total is not None else None,
                )
            )
        return out


def find_gpus() -> GpuReader | None:
    """How to read this host's GPUs (those ``CUDA_VISIBLE_DEVICES`` shows): NVML, else ``nvidia-smi`` on the
    PATH when it lists any; None on a host without GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    reader = _nvml_gpus(visible)
    if reader is not None:
        return reader
    path = shutil.which("nvidia-smi")
    if path is None:
        return None
    smi = _SmiGpus(path, visible)
    return smi if smi.read() else None


# --------------------------------------------------------------------------------------------------- sampler


class TrialSampler:
    """Samples the system metrics of the process ``pid`` (default: this one) and its host, in one thread, from
    ``start()`` to ``stop()``, and hands each sample to ``post`` (``{"system": {name: value}, "time_ms": ...}``);
    see the module docstring."""

    def __init__(self, post: Callable[[Any], None], *, max_interval_s: float, pid: int | None = None) -> None:
        self.post = post
        self.max_interval_s = max(max_interval_s, 0.05)
        self.pid = pid or os.getpid()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweepflow-system-metrics", daemon=True)
        self.samples = 0  # handed over

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Take the last sample, hand it over, and end; waits at most ``timeout_s``. True when it ended in time."""
        self._stopping.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            cpu = _CpuClock(self.pid)
        except psutil.Error as exc:
            log.warning("system metrics: cannot read process %s (%s); none are logged", self.pid, exc)
            return
        try:
            net_start = psutil.net_io_counters()
        except (OSError, RuntimeError):
            net_start = None
        gpus = find_gpus()
        last_sample = started
        while True:
            gap = next_gap(last_sample - started, self.max_interval_s)
            stopping = self._stopping.wait(max(last_sample + gap - time.monotonic(), 0.0))
            if stopping and time.monotonic() - last_sample < LAST_SAMPLE_MIN_S:
                return  # sampled a moment ago: nothing new to say
            last_sample = time.monotonic()
            values = {**cpu.sample(), **_host_memory_disk_network(net_start)}
            if gpus is not None:
                values.update(gpus.read())
            try:
                self.post({"system": values, "time_ms": int(time.time() * 1000)})
            except BaseException as exc:  # noqa: BLE001 - the trial trains on (or is ending): said once, here
                log.warning("system metrics: sampling stopped: %s: %s", type(exc).__name__, exc)
                return
            self.samples += 1
            if stopping:
                return
