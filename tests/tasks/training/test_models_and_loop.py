"""Built-in models, the built-in training function on a real 2-rank Dask cluster, and checkpoint evaluation."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import ddp_runtime as train
from ddp_runtime.torch import TorchTrainer
from sweepflow.tasks.datasets import DataConfig, prepare_dataset
from sweepflow.tasks.training.evaluate import (
    EvaluationResult,
    evaluate_checkpoint,
    evaluate_model,
)
from sweepflow.tasks.training.hparams import MODEL_NAMES, model_hparams, with_defaults
from sweepflow.tasks.training.loop import load_model_from_checkpoint, train_image_classifier
from sweepflow.tasks.training.models import Net, SmallCNN, build_model

# Reaches val accuracy ~0.95 on digits in ~2 s with 2 ranks (seeds 0-3 all gave >= 0.94 when tuned).
DIGITS_CONFIG = {"model": "net", "epochs": 10, "batch_size": 32, "lr": 5e-3, "seed": 0}

# ------------------------------------------------------------------------------------------------- models

SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar": (3, 32, 32)}
TRIAL_HPARAMS = {"l1": 32, "l2": 16, "channels": 8, "dropout": 0.2, "lr": 0.01, "batch_size": 64, "epochs": 3}


@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_build_model_outputs_one_logit_per_class(model_name, shape_name):
    shape = SHAPES[shape_name]
    torch.manual_seed(0)
    model = build_model(model_name, input_shape=shape, num_classes=10, hparams=TRIAL_HPARAMS)
    model.train()  # batch of 2 so BatchNorm can compute batch statistics even on 1x1 feature maps
    logits = model(torch.randn(2, *shape))
    assert logits.shape == (2, 10)
    logits.sum().backward()  # the graph is intact: every layer is reachable from the output


def test_build_model_takes_only_its_own_hyperparameters():
    net = build_model("net", input_shape=(1, 8, 8), num_classes=10, hparams=TRIAL_HPARAMS)
    assert isinstance(net, Net) and net.fc1.out_features == 32 and net.fc2.out_features == 16
    cnn = build_model("small_cnn", input_shape=(3, 32, 32), num_classes=7, hparams=TRIAL_HPARAMS)
    assert isinstance(cnn, SmallCNN) and cnn.head.in_features == 16 and cnn.head.out_features == 7
    assert model_hparams("net", TRIAL_HPARAMS) == {"l1": 32, "l2": 16}
    assert model_hparams("small_cnn", TRIAL_HPARAMS) == {"channels": 8, "dropout": 0.2}
    assert model_hparams("resnet18", TRIAL_HPARAMS) == {}
    assert model_hparams("net", {"l1": 64.0}) == {"l1": 64}  # whole floats from search spaces are fine


def test_net_keeps_the_tutorial_layers_on_cifar_sized_inputs():
    net = Net()  # the Ray Tune tutorial's defaults: 3x32x32, 5x5 convs, 16 * 5 * 5 flattened features
    assert net.conv1.kernel_size == (5, 5) and net.fc1.in_features == 16 * 5 * 5


def test_unknown_model_and_bad_hyperparameters_say_how_to_fix_them():
    with pytest.raises(ValueError, match="unknown model 'vgg'.*net, resnet18, small_cnn"):
        build_model("vgg", input_shape=(1, 8, 8), num_classes=10, hparams={})
    with pytest.raises(ValueError, match="'l1' must be a whole number"):
        build_model("net", input_shape=(1, 8, 8), num_classes=10, hparams={"l1": 12.5})
    with pytest.raises(ValueError, match="input_shape must be"):
        build_model("net", input_shape=(8, 8), num_classes=10, hparams={})  # type: ignore[arg-type]


def test_train_config_is_checked_before_any_work():
    with pytest.raises(ValueError, match="data_path"):
        with_defaults({"epochs": 1})
    with pytest.raises(ValueError, match="optimizer.*adam, adamw, sgd"):
        with_defaults({"data_path": "/x", "optimizer": "lbfgs"})
    assert with_defaults({"data_path": "/x", "epochs": 3.0})["epochs"] == 3


# --------------------------------------------------------------------------------- training on a cluster


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path_factory.mktemp("data"))))


def _orchestration_modules_loaded() -> list[str]:
    """Run on a Dask worker: import the worker-side modules and list any Prefect/MLflow/matplotlib module loaded
    (the worker side of evaluation and registration imports mlflow only when it registers)."""
    import sweepflow.tasks.finalize_on_worker  # noqa: F401
    import sweepflow.tasks.training.evaluate  # noqa: F401
    import sweepflow.tasks.training.loop  # noqa: F401

    loaded = list(sys.modules)  # a snapshot: the worker preload thread may still be importing
    return sorted(m for m in loaded if m.split(".")[0] in ("prefect", "mlflow", "matplotlib"))


def test_worker_side_modules_import_neither_prefect_nor_mlflow():
    # On a worker itself, where the rule matters: it must start fast, torch only. A fresh one, since the session's
    # shared workers have run other tests' functions (cloudpickled closures may import anything).
    from ddp_runtime.cluster import local_cluster

    with local_cluster(n_workers=1) as fresh:
        assert fresh.run(_orchestration_modules_loaded) == dict.fromkeys(fresh.scheduler_info()["workers"], [])


def _fit(client, data_path, storage, name, resume=None, **overrides):
    return TorchTrainer(
        train_image_classifier,
        train_loop_config={"data_path": data_path, **DIGITS_CONFIG, **overrides},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name=name, storage_path=storage),
        resume_from_checkpoint=resume,
        client=client,
    ).fit()


def test_two_rank_training_on_digits_then_evaluate_the_checkpoint(cluster, digits, tmp_path):
    result = _fit(cluster, digits.path, str(tmp_path / "results"), "digits-net")

    assert result.error is None
    history = result.metrics_history
    assert [m["epoch"] for m in history] == list(range(1, DIGITS_CONFIG["epochs"] + 1))
    final = result.metrics
    assert final["val_accuracy"] >= 0.85, history
    assert final["train_loss"] < history[0]["train_loss"]

    ckpt_dir = result.checkpoint.path
    assert {"model.pt", "optimizer.pt", "meta.json"} <= set(os.listdir(ckpt_dir))
    with open(os.path.join(ckpt_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["model"] == "net" and meta["epoch"] == DIGITS_CONFIG["epochs"]
    assert meta["input_shape"] == [1, 8, 8] and meta["num_classes"] == 10 and len(meta["mean"]) == 1

    model = load_model_from_checkpoint(ckpt_dir)
    assert isinstance(model, Net) and not model.training

    # The reported metrics are global: rank 0's all-reduced val accuracy equals a single-process evaluation
    # of the checkpointed weights on the whole val split.
    val = evaluate_model(model, digits.path, split="val")
    assert val.num_samples == digits.sizes["val"]
    assert val.accuracy == pytest.approx(final["val_accuracy"])
    assert val.loss == pytest.approx(final["val_loss"], rel=1e-4)

    test = evaluate_checkpoint(ckpt_dir, digits.path, split="test")
    assert isinstance(test, EvaluationResult)
    assert test.accuracy >= 0.85
    assert len(test.confusion_matrix) == 10 and all(len(row) == 10 for row in test.confusion_matrix)
    assert sum(map(sum, test.confusion_matrix)) == test.num_samples == digits.sizes["test"]
    metrics = test.to_metrics()
    assert metrics["test_accuracy"] == test.accuracy and "test_accuracy_class_3" in metrics

    # Imported here, not at the top: the workers import this module (matplotlib stays off them).
    from sweepflow.tasks.reporting.confusion_matrix import plot_confusion_matrix

    png = plot_confusion_matrix(test.confusion_matrix, test.class_names, tmp_path / "plots" / "confusion.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_resume_from_checkpoint_continues_after_the_saved_epoch(cluster, digits, tmp_path):
    storage = str(tmp_path / "results")
    first = _fit(cluster, digits.path, storage, "first", epochs=2)
    assert [m["epoch"] for m in first.metrics_history] == [1, 2]

    resumed = _fit(cluster, digits.path, storage, "resumed", resume=first.checkpoint, epochs=3)

    assert [m["epoch"] for m in resumed.metrics_history] == [3]
    # It started from the trained weights: its epoch's loss is far below a fresh model's first epoch.
    assert resumed.metrics["train_loss"] < 0.7 * first.metrics_history[0]["train_loss"]
    with open(os.path.join(resumed.checkpoint.path, "meta.json")) as f:
        assert json.load(f)["epoch"] == 3
