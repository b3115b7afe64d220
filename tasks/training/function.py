"""A training function named by import path (``module:function``), imported where it runs."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def import_train_fn(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"training.train_fn={path!r}: cannot import {module_name!r} ({exc}); it must be importable in the flow "
            "process and on every Dask worker (install your package there, or put it on PYTHONPATH)"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"training.train_fn={path!r}: {module_name!r} has no function {attr!r}")
    return fn


@dataclass(frozen=True)
class TrainFunction:
    """A training function named by import path and imported where it runs, on the Dask workers: the flow
    process never imports the training code (nor torch). The module is located at once, so a typo fails the
    trial before any group starts."""

    path: str

    def __post_init__(self) -> None:
        module_name = self.path.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise ImportError(
                f"training.train_fn={self.path!r}: no module {module_name!r}; it must be importable in the flow "
                "process and on every Dask worker (install your package there, or put it on PYTHONPATH)"
            )

    def __call__(self, config: dict[str, Any]) -> Any:
        fn = import_train_fn(self.path)
        # As in Ray, a zero-argument training function simply does not see train_loop_config.
        return fn(config) if inspect.signature(fn).parameters else fn()
