"""Weights & Biases beside MLflow (``sweepflow.air.integrations.wandb``): ``WandbLoggerCallback`` and ``setup_wandb``
in W&B's offline mode (no network: ``WANDB_MODE=offline``, ``WANDB_BASE_URL`` a closed loopback port, and no socket
of this process to anything but loopback), read back from each offline run's ``.wandb`` transaction log: its
records, as ``wandb``'s own protobuf ``Record`` parses them, in the log format ``wandb sync`` reads (checksums
checked)."""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import struct
import sys
import time
import zlib

import pytest

pytest.importorskip("wandb")

from conftest import free_port  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import ddp_runtime as train  # noqa: E402
from ddp_runtime.torch import TorchTrainer  # noqa: E402
from sweepflow import tune  # noqa: E402
from sweepflow.air.integrations.wandb import WandbLoggerCallback, setup_wandb  # noqa: E402
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus  # noqa: E402
from sweepflow.tune.analysis import Trial  # noqa: E402

KEY = "wandb-test-key-" + "5f3a" * 8  # never to be seen in a file, a log or the output

# ------------------------------------------------------------------------------ reading an offline run's records

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str) -> list:
    """The run's records: W&B's transaction log (``:W&B`` header, 32 KiB blocks of checksummed chunks), each
    parsed as ``wandb.proto.wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    found, pos, pending = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left  # a block's zero padding
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if pos + _HEADER + length > len(data):
            break  # a chunk still being written
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: a corrupt record at {pos}"
        pos += _HEADER + length
        if kind in (_FIRST, _MIDDLE):
            pending += chunk
        elif kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            found.append(record)
            pending = b""
    return found


def _finished_records(log_file: str, timeout: float = 60.0) -> list:
    """The log's records once its exit record is in: ``run.finish()`` returns when W&B's service has the run's
    end, and its writer (another process) may still be flushing the file; a loaded machine shows it."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(log_file)
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def read_run(run_dir: str) -> dict:
    """An offline run's id, name, group, project, config, history rows and exit code."""
    (log_file,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    run, config, history, exit_code = None, {}, [], None
    for record in _finished_records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({u.key: json.loads(u.value_json) for u in run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run is not None, f"{run_dir}: no run record"
    return {"id": run.run_id, "name": run.display_name, "group": run.run_group, "project": run.project,
            "config": config, "history": history, "exit_code": exit_code}


def offline_runs(directory) -> dict[str, dict]:
    """Every offline run under ``directory`` (``<dir>/wandb/offline-run-*``), by run id."""
    runs = [read_run(d) for d in sorted(glob.glob(os.path.join(str(directory), "**", "offline-run-*"), recursive=True))]
    return {run["id"]: run for run in runs}


def _no_key_anywhere(*directories, text: str = "") -> None:
    assert KEY not in text
    for directory in directories:
        for path in glob.glob(os.path.join(str(directory), "**", "*"), recursive=True):
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    assert KEY.encode() not in f.read(), f"the API key is in {path}"


_connections: list | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "socket.connect" and _connections is not None:
        _connections.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline, its files in tmp_path/wandb-dir, its server a closed loopback port; fails the test if this
    process connected anywhere but loopback or a Unix socket meanwhile."""
    global _connections
    directory = tmp_path / "wandb-dir"
    directory.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(directory))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _connections = []
    yield directory
    seen, _connections = _connections, None
    remote = [a for a in seen if isinstance(a, tuple) and not ipaddress.ip_address(a[0].split("%")[0]).is_loopback]
    assert not remote, f"connections off this machine: {remote}"


# --------------------------------------------------------------------------------- the callback, hook by hook


def _trial(tmp_path, index, config):
    result = TrialResult(trial_id=f"trial_{index:04d}", index=index, name=f"t{index}", config=config,
                         status=TrialStatus.NOT_STARTED, run_id=f"{index:032x}")
    return Trial(result, local_path=str(tmp_path / "exp" / f"trial_{index:04d}"))


def _result(step, trial, **metrics):
    return {"training_iteration": step, "trial_id": trial.trial_id, "config": dict(trial.config), "done": False,
            "experiment_tag": f"{trial.result.index}_lr={trial.config['lr']}", **metrics}


def test_the_callback_opens_a_run_per_trial_logs_its_results_and_marks_the_failed_one(offline, tmp_path, monkeypatch):
    logger = WandbLoggerCallback(project="proj", excludes=["secret"], log_config=True)
    logger.setup()
    first, second = _trial(tmp_path, 0, {"lr": 0.1, "secret": "s"}), _trial(tmp_path, 1, {"lr": 0.2, "secret": "s"})
    for trial in (first, second):
        logger.log_trial_start(trial)
    for step in (1, 2):
        for trial in (first, second):
            logger.log_trial_result(step, trial, _result(step, trial, loss=trial.config["lr"] / step,
                                                         nested={"acc": step / 4}, note="text", secret=1))
    logger.log_trial_end(first)
    logger.log_trial_end(second, failed=True)
    logger.on_experiment_end([first, second])
    runs = offline_runs(offline)
    assert sorted(runs) == [f"{0:032x}", f"{1:032x}"]  # the trials' MLflow run ids
    run = runs[f"{0:032x}"]
    assert (run["name"], run["group"], run["project"]) == ("t0", "exp", "proj")
    assert [row["loss"] for row in run["history"]] == pytest.approx([0.1, 0.05])
    assert [row["_step"] for row in run["history"]] == [1, 2] and run["history"][1]["nested/acc"] == 0.5
    assert run["history"][0]["config/lr"] == 0.1  # log_config
    assert not {"note", "secret", "config/secret", "done", "trial_id", "experiment_tag"} & set(run["history"][0])
    assert run["config"]["lr"] == 0.1 and "secret" not in run["config"]
    assert run["config"]["trial_id"] == "trial_0000" and run["config"]["experiment_tag"] == "0_lr=0.1"
    assert run["config"]["trial_log_path"] == first.local_path
    assert run["exit_code"] == 0 and runs[f"{1:032x}"]["exit_code"] == 1


def test_without_wandb_dir_a_trials_run_is_in_its_directory_and_config_is_not_logged_per_result(offline, tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.delenv("WANDB_DIR")
    logger = WandbLoggerCallback(project="proj", group="mine")
    trial = _trial(tmp_path, 0, {"lr": 0.1})
    logger.log_trial_result(1, trial, _result(1, trial, loss=1.0))  # starts the run (as Ray's does)
    logger.on_experiment_end([trial])  # finishes what is still open
    (run,) = offline_runs(trial.local_path).values()
    assert run["group"] == "mine" and run["history"][0]["loss"] == 1.0 and "config/lr" not in run["history"][0]
    assert glob.glob(os.path.join(trial.local_path, "wandb", "offline-run-*"))


def test_a_project_is_required_and_the_api_key_goes_only_into_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_PROJECT_NAME", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"give WandbLoggerCallback\(project=...\) or set WANDB_PROJECT_NAME"):
        WandbLoggerCallback(api_key=KEY).setup()
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with pytest.raises(ValueError, match="give api_key or api_key_file, not both") as both:
        WandbLoggerCallback(project="p", api_key=KEY, api_key_file=str(key_file))
    with pytest.raises(FileNotFoundError, match="api_key_file") as missing:
        setup_wandb(api_key_file=str(tmp_path / "nowhere"))
    logger = WandbLoggerCallback(project="p", api_key_file=str(key_file))
    logger.setup()
    assert os.environ["WANDB_API_KEY"] == KEY  # where wandb reads it; monkeypatch puts the environment back
    assert KEY not in repr(logger) + str(both.value) + str(missing.value)
    assert all(KEY not in repr(value) for name, value in vars(logger).items() if name != "_key")


def test_without_wandb_it_is_one_sentence_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[wandb\]'"):
        WandbLoggerCallback(project="p")
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[wandb\]'"):
        setup_wandb()


# ------------------------------------------------------------------------------------ real runs, as users write


def reporting(config):
    for step in range(3):
        if config["lr"] == 0.3 and step == 1:
            raise RuntimeError("diverged")
        tune.report(loss=config["lr"] * (3 - step), nested={"lr": config["lr"]})


def test_tune_run_with_the_callback_has_one_wandb_run_per_trial_beside_its_mlflow_run(services, offline, tmp_path,
                                                                                      capfd):
    analysis = tune.run(
        reporting,
        config={"lr": tune.grid_search([0.1, 0.2, 0.3])},
        callbacks=[WandbLoggerCallback(project="sweeps", log_config=True, api_key=KEY)],
        storage_path=str(tmp_path / "results"),
        name="wandb-logged",
        raise_on_failed_trial=False,
        verbose=0,
    )
    trials = {t.trial_id: t for t in analysis.trials}
    runs = offline_runs(offline)
    assert sorted(runs) == sorted(t.mlflow_run_id for t in trials.values())  # one W&B run per trial
    assert len(glob.glob(str(offline / "wandb" / "offline-run-*"))) == 3
    client = MlflowClient(services["mlflow"])
    for trial in trials.values():
        run = runs[trial.mlflow_run_id]
        lr = trial.config["lr"]
        assert (run["group"], run["project"], run["config"]["lr"]) == ("wandb-logged", "sweeps", lr)
        assert run["name"] == str(trial) and run["config"]["trial_id"] == trial.trial_id
        reported = 1 if lr == 0.3 else 3
        assert [row["loss"] for row in run["history"]] == pytest.approx([lr * k for k in (3, 2, 1)][:reported])
        assert [row["_step"] for row in run["history"]] == [1, 2, 3][:reported]
        assert all(row["nested/lr"] == lr and row["config/lr"] == lr for row in run["history"])
        assert run["exit_code"] == (1 if lr == 0.3 else 0)
        # MLflow records the trial all the same: W&B is beside it, never instead of it
        history = client.get_metric_history(trial.mlflow_run_id, "loss")
        assert [m.value for m in history] == pytest.approx([row["loss"] for row in run["history"]])
    assert trials[next(i for i, t in trials.items() if t.config["lr"] == 0.3)].status == "ERROR"
    captured = capfd.readouterr()
    _no_key_anywhere(offline, tmp_path / "results", tmp_path / "home", text=captured.out + captured.err)


def wandb_trainable(config):
    run = setup_wandb({"lr": config["lr"], "opaque": object()}, project="fn", mode="offline", dir=config["dir"])
    for step in (1, 2):
        run.log({"loss": config["lr"] / step}, step=step)
        tune.report(loss=config["lr"] / step)
    if config["lr"] == 0.2:
        raise RuntimeError("diverged")


def test_setup_wandb_in_a_function_trainable_opens_the_trials_run_and_finishes_it(services, offline, tmp_path):
    where = tmp_path / "trainable-wandb"
    where.mkdir()
    analysis = tune.run(
        wandb_trainable,
        config={"lr": tune.grid_search([0.1, 0.2]), "dir": str(where)},
        storage_path=str(tmp_path / "results"),
        name="fn-wandb",
        raise_on_failed_trial=False,
        verbose=0,
    )
    runs = offline_runs(where)
    assert sorted(runs) == sorted(t.mlflow_run_id for t in analysis.trials)
    for trial in analysis.trials:
        run = runs[trial.mlflow_run_id]
        lr = trial.config["lr"]
        assert (run["group"], run["project"]) == ("fn-wandb", "fn")
        assert run["name"] == MlflowClient(services["mlflow"]).get_run(trial.mlflow_run_id).info.run_name
        assert run["config"]["lr"] == lr and run["config"]["opaque"].startswith("<object object")
        assert [row["loss"] for row in run["history"]] == pytest.approx([lr, lr / 2])
        assert run["exit_code"] == (1 if lr == 0.2 else 0)  # finished when the function returned or raised


def wandb_loop(config):
    run = setup_wandb({"width": 4}, project="ddp", mode="offline", dir=config["dir"])
    rank = train.get_context().get_world_rank()
    with open(os.path.join(config["dir"], f"rank{rank}"), "w") as f:
        f.write(type(run).__name__)
    for step in (1, 2):
        run.log({"loss": 1.0 / step, "rank": rank})
        train.report({"loss": 1.0 / step})


def test_setup_wandb_in_a_torchtrainer_loop_opens_a_run_on_rank_zero_only(cluster, offline, tmp_path):
    where = tmp_path / "loop-wandb"
    where.mkdir()
    result = TorchTrainer(
        wandb_loop,
        train_loop_config={"dir": str(where)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="ddp-wandb", storage_path=str(tmp_path / "results")),
        client=cluster,
    ).fit()
    assert result.error is None, result.error
    (run,) = offline_runs(where).values()  # rank 1 got a disabled run: nothing written
    assert (run["name"], run["group"], run["project"], run["config"]["width"]) == ("ddp-wandb", "ddp-wandb", "ddp", 4)
    assert [(row["loss"], row["rank"]) for row in run["history"]] == [(1.0, 0), (0.5, 0)]
    assert run["exit_code"] == 0  # finished when the rank's function returned
    assert (where / "rank1").read_text() == "NoopRun" and (where / "rank0").read_text() != "NoopRun"
