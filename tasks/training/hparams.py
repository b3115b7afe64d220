"""The built-in classifier's settings: its defaults, the checks on a trial's config, what it reports. No torch.

``train_image_classifier`` (``loop.py``) runs these checks on its first line; the pipeline's pre-flight runs the
same ones on every config the sweep will give it before any work (``BUILTIN_CHECKS``). They live apart from the
training code so that the flow process, which runs no torch op, checks the built-in function without importing
torch: a deployment's flow run starts in a new process, where that import took ~3 s before its first task.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

OPTIMIZERS = ("adam", "adamw", "sgd")

#: What ``train_image_classifier`` reports once per epoch.
REPORTS = ("epoch", "train_loss", "val_loss", "val_accuracy")

DEFAULTS: dict[str, Any] = {
    "model": "net",
    "epochs": 10,
    "batch_size": 64,
    "lr": 1e-3,
    "optimizer": "adam",
    "momentum": 0.9,
    "weight_decay": 0.0,
    "seed": 0,
    "num_workers": 0,
}


def _whole(value: Any) -> bool:
    """A whole number of any numeric type (search spaces often yield floats or numpy numbers), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and float(value).is_integer()


def _positive_int(name: str, value: Any) -> int:
    if not _whole(value):
        raise ValueError(
            f"model hyperparameter {name!r} must be a whole number, got {value!r}; "
            "use an integer search space (e.g. randint/qrandint or a choice of ints)"
        )
    number = int(value)
    if number < 1:
        raise ValueError(f"model hyperparameter {name!r} must be >= 1, got {value!r}")
    return number


def _probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"model hyperparameter {name!r} must be a number in [0, 1), got {value!r}")
    return float(value)


#: Each built-in model's hyperparameters: name -> validator (``models.py`` builds the models).
MODEL_HPARAMS: dict[str, Mapping[str, Callable[[str, Any], Any]]] = {
    "net": {"l1": _positive_int, "l2": _positive_int},
    "resnet18": {},
    "small_cnn": {"channels": _positive_int, "dropout": _probability},
}

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_HPARAMS)


def model_hparams(name: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``hparams`` that model ``name`` takes, validated and converted to plain Python types.

    Keys the model does not take (``lr``, ``batch_size``, ...) are dropped; missing ones keep the model's
    defaults. What this returns is what a checkpoint records to rebuild the model.
    """
    try:
        checks = MODEL_HPARAMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; use one of: {', '.join(MODEL_NAMES)}") from None
    return {key: check(key, hparams[key]) for key, check in checks.items() if key in hparams}


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """Config with defaults filled in, checked here so a typo fails on the first line, not mid-epoch."""
    cfg = {**DEFAULTS, **config}
    if not cfg.get("data_path"):
        raise ValueError(
            "train_image_classifier needs config['data_path']: the prepared dataset directory, i.e. "
            "sweepflow.tasks.datasets.prepare_dataset(DataConfig(...)).path"
        )
    for key, minimum in (("epochs", 1), ("batch_size", 1), ("seed", 0), ("num_workers", 0)):
        value = cfg[key]
        if not _whole(value):
            raise ValueError(f"config[{key!r}] must be a whole number, got {value!r}")
        if value < minimum:
            raise ValueError(f"config[{key!r}] must be >= {minimum}, got {value!r}")
        cfg[key] = int(value)
    for key in ("lr", "momentum", "weight_decay"):
        cfg[key] = float(cfg[key])
    if not math.isfinite(cfg["lr"]) or cfg["lr"] <= 0:
        raise ValueError(f"config['lr'] must be a positive number, got {config.get('lr')!r}")
    cfg["optimizer"] = str(cfg["optimizer"]).lower()
    if cfg["optimizer"] not in OPTIMIZERS:
        raise ValueError(
            f"config['optimizer'] must be one of {', '.join(OPTIMIZERS)}, got {cfg['optimizer']!r}"
        )
    return cfg


def validate_config(config: Mapping[str, Any]) -> None:
    """Everything ``train_image_classifier`` checks on its first line, run before a sweep starts (the prepared
    data path is filled in later by the pipeline, so a stand-in is used when it is missing)."""
    cfg = with_defaults({"data_path": "<the prepared dataset>", **config})
    model_hparams(cfg["model"], cfg)


#: The built-in training function's checks as the pre-flight reads a training function's (its ``validate`` and
#: ``reports`` attributes, ``sweepflow.tasks.training.function.with_checks``), without importing it.
BUILTIN_CHECKS = SimpleNamespace(validate=validate_config, reports=REPORTS)
