"""What tests/e2e/test_multihost.py runs on the Dask workers of its network-namespace hosts (importable there via
PYTHONPATH, as a user's package would be): the pipeline's training function, recording where each rank ran and
how it connected, and holding its group after a given epoch so the test can take a host away mid-trial."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from unittest import mock

import psutil
from distributed import Event, get_worker

import ddp_runtime
from sweepflow.tasks.training.function import with_checks
from sweepflow.tasks.training.loop import train_image_classifier, validate_config

HOLD_LIMIT_S = 300  # a held group gives up after this (the test failed before releasing it)


def _ip(text: str) -> str:
    """An IPv4 address as itself, also when a dual-stack socket shows it IPv4-mapped (::ffff:10.0.0.1)."""
    address = ipaddress.ip_address(text)
    return str(getattr(address, "ipv4_mapped", None) or address)


def _connections() -> list[list]:
    """This process's established TCP connections: [local ip, local port, remote ip, remote port]."""
    return [
        [_ip(c.laddr.ip), c.laddr.port, _ip(c.raddr.ip), c.raddr.port]
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr
    ]


@with_checks(validate=validate_config, reports=("epoch", "train_loss", "val_loss", "val_accuracy"))
def train_recording_placement(config: dict) -> None:
    """The pipeline's ``train_image_classifier``, plus:

    - after its group's first report (process group up, gloo connected), each rank writes
      ``config["record_dir"]/rank<r>-<pid>.json``: its Dask worker's address, the torchrun variables and the
      socket-interface variables it trained with, whether it resumed from a checkpoint, when it started, and its
      TCP connections (gloo's among them);
    - a group that did not resume holds after its report of epoch ``config["hold_at"]`` (the checkpoint of that
      epoch committed: ``report`` returns only then), each rank writing ``held-rank<r>`` first, until the file
      ``released`` appears there.
    """
    record_dir = config["record_dir"]
    rank = ddp_runtime.get_context().get_world_rank()
    resumed = ddp_runtime.get_checkpoint() is not None
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "worker": get_worker().address,
        "resumed": resumed,
        "started": time.time(),
        **{
            name: os.environ.get(name)
            for name in (
                "MASTER_ADDR",
                "MASTER_PORT",
                "WORLD_SIZE",
                "GLOO_SOCKET_IFNAME",
                "NCCL_SOCKET_IFNAME",
            )
        },
    }
    real_report = ddp_runtime.report
    reported = []

    def report(metrics: dict, checkpoint: ddp_runtime.Checkpoint | None = None) -> None:
        real_report(metrics, checkpoint=checkpoint)
        if not reported:
            path = os.path.join(record_dir, f"rank{rank}-{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({**record, "first_report": time.time(), "connections": _connections()}, f)
            os.replace(path + ".tmp", path)
        reported.append(metrics["epoch"])
        if not resumed and metrics["epoch"] == config["hold_at"]:
            open(os.path.join(record_dir, f"held-rank{rank}"), "w").close()
            deadline = time.monotonic() + HOLD_LIMIT_S
            while not os.path.exists(os.path.join(record_dir, "released")):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"held after epoch {metrics['epoch']} for {HOLD_LIMIT_S} s: nobody released it"
                    )
                time.sleep(0.05)

    # The loop calls ddp_runtime.report at the end of each epoch: it gets ours (one rank per worker process).
    with mock.patch.object(ddp_runtime, "report", report):
        train_image_classifier(config)


def occupy(event_name: str, limit_s: float = 600) -> str:
    """A Dask task standing for another user's work: holds its worker's thread until the Dask Event is set."""
    Event(event_name).wait(timeout=limit_s)
    return get_worker().address
