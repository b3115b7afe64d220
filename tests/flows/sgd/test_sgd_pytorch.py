"""sweepflow.sgd.pytorch: Ray's legacy creator-style PyTorchTrainer / PyTorchTrainable on ddp_runtime, against a
real Dask LocalCluster with worker processes (gloo, CPU)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import paths
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ddp_runtime
from ddp_runtime.torch import TorchTrainer
from sweepflow import tune
from sweepflow.sgd import pytorch as sgd
from sweepflow.sgd.pytorch import PyTorchTrainable, PyTorchTrainer

ROOT = str(paths.ROOT)
PROBE = torch.linspace(0, 10, 7)[:, None]


class LinearDataset(Dataset):
    """Ray's toy: y = a * x + b on x in [0, 10)."""

    def __init__(self, a, b, size=1000):
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(a * x + b)

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self):
        return len(self.x)


# The creators of Ray 0.8 (data_creator(batch_size, config), a separate loss_creator) ...
def model_creator(config):
    return nn.Linear(1, 1)


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))


def data_creator(batch_size, config):
    return LinearDataset(2, 5), LinearDataset(2, 5, size=400)


# ... and of Ray 0.7 (data_creator(config), optimizer_creator returning (criterion, optimizer)).
def legacy_data_creator(config):
    return LinearDataset(2, 5), LinearDataset(2, 5, size=400)


def legacy_optimizer_creator(model, config):
    return nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=config["lr"])


def loader_data_creator(batch_size, config):
    """Ray 0.8's example: DataLoaders, with a DistributedSampler when torch.distributed is initialised."""
    train_set = LinearDataset(2, 5)
    sampler = DistributedSampler(train_set) if dist.is_initialized() else None
    return (
        DataLoader(train_set, batch_size=batch_size, shuffle=sampler is None, sampler=sampler),
        DataLoader(LinearDataset(2, 5, size=400), batch_size=batch_size),
    )


def rank_train_function(model, train_iterator, criterion, optimizer, config):
    return {
        "train_loss": float(ddp_runtime.get_context().get_world_rank()),  # 0 and 1: averaged to 0.5
        "hook": os.environ.get("SGD_TEST_HOOK"),
        "model_type": type(model).__name__,
        "batches": len(train_iterator),
    }


def _trainer(**kwargs):
    args = dict(
        model_creator=model_creator,
        data_creator=data_creator,
        optimizer_creator=optimizer_creator,
        loss_creator=nn.MSELoss,
        num_replicas=2,
        batch_size=8,
    )
    args.update(kwargs)
    return PyTorchTrainer(**args)


def test_two_replicas_train_the_linear_toy_and_validate(cluster):
    trainer = _trainer()
    root = trainer._root
    try:
        stats = [trainer.train() for _ in range(3)]
        validation = trainer.validate()
        model = trainer.get_model()
    finally:
        trainer.shutdown()
    losses = [s["train_loss"] for s in stats]
    assert [s["epoch"] for s in stats] == [1, 2, 3]
    assert losses[2] < losses[1] < losses[0], losses
    assert stats[0]["batch_processed"] == 500  # rank 0 saw its half of the 1000 samples: the data is sharded
    assert {"batch_time", "data_time"} <= set(stats[0])
    assert {"validation_loss", "mean_accuracy", "batch_time"} <= set(validation) and validation["epoch"] == 3
    assert validation["validation_loss"] < losses[0]
    assert type(model) is nn.Linear and model.weight.device.type == "cpu"
    assert abs(model.weight.item() - 2) < abs(0 - 2)  # moved towards y = 2x + 5 from its init in (-1, 1)
    assert not os.path.exists(root), "shutdown() must remove the trainer's state directory"
    assert cluster.submit(lambda: 41 + 1, pure=False).result() == 42, "a cluster it did not start stays up"
    with pytest.raises(RuntimeError, match="shut down"):
        trainer.train()


def test_save_and_restore_round_trip_into_a_fresh_trainer(cluster, tmp_path):
    first = _trainer()
    try:
        first.train()
        path = str(tmp_path / "model.pth")
        assert first.save(path) == path
        trained = first.get_model()
    finally:
        first.shutdown()
    second = _trainer()
    try:
        untrained = second.get_model()
        second.restore(path)
        restored = second.get_model()
        assert torch.equal(restored(PROBE), trained(PROBE))
        assert not torch.equal(untrained(PROBE), trained(PROBE))
        assert second.train()["epoch"] == 2  # the epoch count travels with the checkpoint
        torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pth")
        with pytest.raises(ValueError, match="not a PyTorchTrainer checkpoint"):
            second.restore(str(tmp_path / "other.pth"))
    finally:
        second.shutdown()


def test_ray_07_creators_and_a_lambda_model_creator(cluster):
    trainer = PyTorchTrainer(
        lambda config: nn.Linear(1, 1),
        legacy_data_creator,
        legacy_optimizer_creator,  # returns (criterion, optimizer): no loss_creator
        config={"lr": 1e-2},
        num_replicas=2,
        batch_size=8,
    )
    try:
        losses = [trainer.train()["train_loss"] for _ in range(2)]
        assert "validation_loss" in trainer.validate()
    finally:
        trainer.shutdown()
    assert losses[1] < losses[0]


def test_data_creator_returning_dataloaders_keeps_their_distributed_sampler(cluster):
    trainer = _trainer(data_creator=loader_data_creator)
    try:
        stats = trainer.train()
    finally:
        trainer.shutdown()
    assert stats["batch_processed"] == 500  # sharded by the creator's own DistributedSampler
    assert stats["epoch"] == 1


def test_custom_train_function_stats_are_averaged_across_replicas_and_the_hook_runs(cluster):
    token = uuid.uuid4().hex
    trainer = _trainer(
        train_function=rank_train_function,
        initialization_hook=lambda: os.environ.__setitem__("SGD_TEST_HOOK", token),
    )
    try:
        stats = trainer.train()
    finally:
        trainer.shutdown()
    assert stats["train_loss"] == 0.5
    assert stats["hook"] == token
    assert stats["model_type"] == "DistributedDataParallel"  # Ray passed the DDP-wrapped model too
    assert stats["batches"] == 125  # 500 samples per replica, batch 8 // 2 replicas = 4
    assert stats["epoch"] == 1


@pytest.fixture
def groups_started(monkeypatch):
    """Records every DDP group the trainer would start (and starts none)."""
    started = []

    class NoGroup:
        def __init__(self, *args, **kwargs):
            started.append(kwargs)

        def fit(self):
            raise AssertionError("a DDP group was started")

    monkeypatch.setattr(sgd, "TorchTrainer", NoGroup)
    return started


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"num_replicas": 0}, ValueError, r"num_replicas must be an int >= 1.*num_replicas=1"),
        ({"batch_size": 1}, ValueError, r"batch_size must be an int >= 2.*split across the 2 replicas"),
        (
            {"optimizer_creator": lambda model: None},
            TypeError,
            r"optimizer_creator is called as optimizer_creator\(model, config\)",
        ),
        ({"backend": "nccl"}, ValueError, r'backend="nccl" needs GPUs.*use_gpu=True'),
        ({"loss_creator": dict}, TypeError, r"loss_creator must be a loss class"),
    ],
)
def test_argument_mistakes_fail_at_construction_naming_the_argument(groups_started, kwargs, error, message):
    with pytest.raises(error, match=message):
        _trainer(**kwargs)
    assert groups_started == []


@pytest.mark.parametrize(
    "returned, message",
    [
        (
            lambda: (torch.zeros(4, 1), torch.zeros(4, 1)),
            r"data_creator must return.*element 0 is not a Dataset.*TensorDataset",
        ),
        (lambda: [LinearDataset(2, 5)] * 3, r"data_creator must return.*a list of 3"),
        (lambda: {"train": LinearDataset(2, 5)}, r"data_creator must return.*element 0 is not a Dataset"),
    ],
)
def test_a_data_creator_returning_the_wrong_thing_fails_before_any_group(
    cluster, groups_started, returned, message
):
    with pytest.raises(ValueError, match=message):
        _trainer(data_creator=lambda batch_size, config: returned())
    assert groups_started == []


def test_validate_without_a_validation_set_fails_before_any_group(cluster, groups_started):
    trainer = _trainer(data_creator=lambda batch_size, config: LinearDataset(2, 5))
    try:
        with pytest.raises(
            ValueError, match="No validation dataloader provided.*return \\(train, validation\\)"
        ):
            trainer.validate()
    finally:
        trainer.shutdown()
    assert groups_started == []


TUNE_CONFIG = {
    "model_creator": model_creator,
    "data_creator": data_creator,
    "optimizer_creator": optimizer_creator,
    "loss_creator": nn.MSELoss,
    "num_replicas": 2,
    "use_gpu": False,
    "batch_size": 8,
    "backend": "gloo",
    "config": {"lr": 1e-2},
}


def test_trainable_plan_is_a_ddp_group_of_num_replicas():
    plan = PyTorchTrainable._sweepflow_trial_template(TUNE_CONFIG)
    assert plan["num_ranks"] == 2
    assert plan["resources_per_rank"] == {"CPU": 1, "GPU": 0} and plan["use_gpu"] is False
    assert callable(plan["function"])
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lr'\].*config\['config'\]"):
        PyTorchTrainable._sweepflow_trial_template({**TUNE_CONFIG, "lr": 0.1})
    with pytest.raises(ValueError, match=r'config\["num_replicas"\] must be an int >= 1'):
        PyTorchTrainable._sweepflow_trial_template({**TUNE_CONFIG, "num_replicas": 0})
    with pytest.raises(TypeError, match=r'config\["model_creator"\] is called as model_creator\(config\)'):
        PyTorchTrainable._sweepflow_trial_template({**TUNE_CONFIG, "model_creator": lambda: None})


def test_trainable_trains_until_stopped_and_resumes_from_its_checkpoint(cluster, tmp_path):
    plan = PyTorchTrainable._sweepflow_trial_template(TUNE_CONFIG)
    reports = []

    def stop_after_three(metrics):  # what a Tune scheduler / stop criterion does
        reports.append(metrics)
        return len(reports) >= 3

    def trial(config, **kwargs):
        return TorchTrainer(
            plan["function"],
            train_loop_config=config,
            scaling_config=ddp_runtime.ScalingConfig(num_workers=plan["num_ranks"]),
            run_config=ddp_runtime.RunConfig(storage_path=str(tmp_path)),
            client=cluster,
            **kwargs,
        ).fit()

    first = trial(TUNE_CONFIG, on_report=stop_after_three)
    assert first.stopped_early and first.checkpoint is not None
    assert [m["epoch"] for m in first.metrics_history] == [1, 2, 3]
    for metrics in first.metrics_history:
        assert {"train_loss", "validation_loss", "mean_accuracy", "batch_processed"} <= set(metrics)
    # Restarted from its latest checkpoint, with the sweepflow-only "epochs" limit: it ends by itself.
    resumed = trial({**TUNE_CONFIG, "epochs": 5}, resume_from_checkpoint=first.checkpoint)
    assert not resumed.stopped_early and resumed.error is None
    assert [m["epoch"] for m in resumed.metrics_history] == [4, 5]
    assert resumed.metrics_history[-1]["train_loss"] < first.metrics_history[0]["train_loss"]


SHUTDOWN_SCRIPT = textwrap.dedent(
    """
    import json, os
    import psutil, torch
    from torch import nn
    from sweepflow.sgd.pytorch import PyTorchTrainer

    def data_creator(batch_size, config):
        x = torch.arange(0, 10, 0.1)[:, None]
        return torch.utils.data.TensorDataset(x, 2 * x + 5)

    def cluster_processes():  # the workers: spawned, or forked from the fork server (which lives as long as we do)
        return [p for p in psutil.Process().children(recursive=True)
                if "spawn_main" in " ".join(p.cmdline())
                or ("forkserver" in " ".join(p.cmdline()) and p.ppid() != os.getpid())]

    assert cluster_processes() == []
    trainer = PyTorchTrainer(lambda config: nn.Linear(1, 1), data_creator,
                             lambda model, config: torch.optim.SGD(model.parameters(), lr=1e-3),
                             num_replicas=2, batch_size=8)
    started = cluster_processes()
    cluster, root = trainer._client.cluster, trainer._root
    stats = trainer.train()
    trainer.shutdown()
    gone, alive = psutil.wait_procs(started, timeout=30)
    print(json.dumps({"started": len(started), "alive": [p.pid for p in alive], "cluster": cluster.status.name,
                      "root_exists": os.path.exists(root), "epoch": stats["epoch"]}))
    """
)


@pytest.mark.subprocess
@pytest.mark.dask  # its script starts a LocalCluster
def test_shutdown_closes_the_cluster_it_started_and_leaves_no_process():
    out = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["started"] >= 2  # the nannies and workers of a 2-worker LocalCluster
    assert report["alive"] == []
    assert report["cluster"] == "closed"
    assert report["root_exists"] is False and report["epoch"] == 1


@pytest.mark.subprocess
@pytest.mark.dask  # its script starts a LocalCluster
def test_ray_train_example_runs_with_only_its_import_changed():
    out = subprocess.run(
        [sys.executable, os.path.join("examples", "ray_sgd_pytorch_trainer.py"), "--num-replicas", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "success!"


def test_trainable_plan_refuses_a_searched_group_shape():
    with pytest.raises(ValueError, match=r'config\["num_replicas"\] is searched.*one tune.run per value'):
        PyTorchTrainable._sweepflow_trial_template({**TUNE_CONFIG, "num_replicas": tune.grid_search([1, 2])})
    with pytest.raises(ValueError, match=r'config\["use_gpu"\] is searched'):
        PyTorchTrainable._sweepflow_trial_template({**TUNE_CONFIG, "use_gpu": tune.choice([True, False])})


# ------------------------------------------------------------------------------- under tune.run, with services


def test_pytorch_trainable_runs_under_tune_run(services, tmp_path):
    from mlflow.tracking import MlflowClient

    # Ray: PyTorchTrainable builds PyTorchTrainer(**config), so the creators' hyperparameters go under "config".
    # (lr=1e-1 diverges to NaN on this toy, x in [0, 10): SGD is stable below 2 / E[x^2] ~ 0.06.)
    analysis = tune.run(
        PyTorchTrainable,
        config={**TUNE_CONFIG, "config": {"lr": tune.grid_search([1e-3, 1e-2])}},
        stop={"training_iteration": 2},
        name="pytorch-trainable",
        verbose=0,
    )
    trials = analysis.trials
    assert [t.config["config"] for t in trials] == [{"lr": 1e-3}, {"lr": 1e-2}]
    assert all(t.config["num_replicas"] == 2 and t.config["model_creator"] is model_creator for t in trials)
    for trial in trials:
        assert trial.status == "TERMINATED", trial.error_msg
        assert [m["training_iteration"] for m in trial.metric_history] == [1, 2]
        assert [m["epoch"] for m in trial.metric_history] == [1, 2]
        for metrics in trial.metric_history:
            assert {"train_loss", "validation_loss", "mean_accuracy"} <= set(metrics)
            assert metrics["batch_processed"] == 500  # each of the 2 ranks: half of the 1000 samples

    # One MLflow parent run; a child run per trial, with the train loss of every iteration (step = epoch).
    mlflow = MlflowClient(services["mlflow"])
    parent = mlflow.get_run(analysis.record.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.params["ranks_per_trial"] == "2"
    children = mlflow.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert sorted(c.info.run_id for c in children) == sorted(t.mlflow_run_id for t in trials)
    for child in children:
        assert child.info.status == "FINISHED" and child.data.params["num_ranks"] == "2"
        history = mlflow.get_metric_history(child.info.run_id, "train_loss")
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2]
    trial_of_run = {t.mlflow_run_id: t for t in trials}
    for child in children:
        trial = trial_of_run[child.info.run_id]
        logged = sorted(mlflow.get_metric_history(child.info.run_id, "train_loss"), key=lambda m: m.step)
        assert [m.value for m in logged] == pytest.approx([m["train_loss"] for m in trial.metric_history])

    # The best trial by validation loss; its checkpoint (PyTorchTrainer's state file) restores a fresh trainer.
    best = analysis.get_best_trial(metric="validation_loss", mode="min")
    assert all(np.isfinite(t.last_result["validation_loss"]) for t in trials)
    assert best is min(trials, key=lambda t: t.last_result["validation_loss"])
    assert best.config["config"] == {"lr": 1e-2}  # the larger stable step: closer to y = 2x + 5 in 2 epochs
    assert analysis.get_best_config(metric="validation_loss", mode="min") == best.config
    assert os.path.isfile(os.path.join(best.checkpoint.value, sgd.STATE_FILE))
    trainer = _trainer(config=best.config["config"])
    try:
        with pytest.raises(ValueError, match="directory without state.pt"):
            trainer.restore(str(tmp_path))
        trainer.restore(best.checkpoint.value)  # Ray: trainer.restore(trial.checkpoint.value)
        validation = trainer.validate()
        assert validation["epoch"] == 2
        assert validation["validation_loss"] == pytest.approx(best.last_result["validation_loss"], rel=1e-5)
        assert trainer.train()["epoch"] == 3  # training goes on from the trial's state
    finally:
        trainer.shutdown()


@pytest.mark.subprocess
def test_ray_tune_example_runs_with_only_its_imports_changed(services):
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "MLFLOW_TRACKING_URI": services["mlflow"],
        "DASK_SCHEDULER_ADDRESS": services["dask"],
    }
    out = subprocess.run(
        [sys.executable, os.path.join("examples", "ray_sgd_tune_example.py"), "--smoke-test"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Number of trials: 2 (2 TERMINATED)" in out.stdout
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("Best config: "), out.stdout[-3000:]
    assert ast.literal_eval(last.removeprefix("Best config: ")) == {
        "model_creator": "model_creator",
        "data_creator": "data_creator",
        "optimizer_creator": "optimizer_creator",
        "loss_creator": "MSELoss",
        "num_replicas": 1,
        "use_gpu": False,
        "batch_size": 512,
        "backend": "gloo",
    }
