"""``sweepflow.tune.utils``: Ray's ``validate_save_restore`` and the dict helpers Ray's scripts use
(``flatten_dict``, ``merge_dicts``, ``unflattened_lookup``, ``date_str``); the rest of ``ray.tune.utils`` is Ray's
own plumbing (its object store, its GPUs), refused with what to use instead."""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from sweepflow.tune.not_built import refusing

__all__ = ["date_str", "flatten_dict", "merge_dicts", "unflattened_lookup", "validate_save_restore"]


def flatten_dict(dt: Mapping[str, Any], delimiter: str = "/", prevent_delimiter: bool = False) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}`` (nested mappings only; lists stay values), as Ray's.

    Raises:
        ValueError: ``prevent_delimiter`` and a key already holds ``delimiter``.
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Mapping[str, Any]) -> None:
        for key, item in value.items():
            if prevent_delimiter and delimiter in str(key):
                raise ValueError(f"flatten_dict: the key {key!r} holds the delimiter {delimiter!r}")
            name = f"{prefix}{delimiter}{key}" if prefix else str(key)
            if isinstance(item, Mapping) and item:
                walk(name, item)
            else:
                flat[name] = item

    walk("", dt)
    return flat


def unflattened_lookup(flat_key: str, lookup: Mapping[str, Any] | list[Any], delimiter: str = "/") -> Any:
    """The value at ``"a/b/0"`` in nested mappings and lists (a list index as a number), as Ray's.

    Raises:
        KeyError: no such key; IndexError: no such list index.
    """
    value: Any = lookup
    for part in flat_key.split(delimiter):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def merge_dicts(d1: Mapping[str, Any], d2: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``d1`` updated by ``d2``, nested mappings merged key by key (neither argument changes)."""
    merged = copy.deepcopy(dict(d1))
    for key, value in d2.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_dicts(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def date_str() -> str:
    """The local time as Ray names experiment directories by it: ``2026-12-01_23-59-59``."""
    return time.strftime("%Y-%m-%d_%H-%M-%S")


def validate_save_restore(
    trainable_cls: type,
    config: Mapping[str, Any] | None = None,
    num_gpus: float = 0,
    use_object_store: bool = False,
) -> bool:
    """Check that a class trainable resumes from its own checkpoint, as a trial does after a restart or a PBT
    exploit (Ray's helper): one object trains 3 steps and saves; a second one, built with the same ``config``,
    restores that checkpoint and must go on at step 4, then 5. Returns True; raises AssertionError saying what
    went wrong. Both objects live in this process (Ray uses two actors), so ``num_gpus`` and
    ``use_object_store`` are accepted and change nothing."""
    from sweepflow.tune.class_trainable import is_class_trainable

    if not is_class_trainable(trainable_cls):
        raise TypeError(
            f"validate_save_restore({trainable_cls!r}): give a subclass of sweepflow.tune.Trainable (a function "
            "trainable saves its own checkpoints with tune.report(..., checkpoint=...))"
        )
    first = trainable_cls(dict(config or {}))
    second = trainable_cls(dict(config or {}))
    try:
        for _ in range(3):
            first.train()
        with tempfile.TemporaryDirectory(prefix="sweepflow-validate-") as directory:
            first.save(directory)
            second.restore(directory)
        for expected in (4, 5):
            second.train()
            assert second.iteration == expected, (
                f"{trainable_cls.__name__} restored from its checkpoint after step 3 is at step {second.iteration} "
                f"after another step, not {expected}"
            )
    finally:
        first.stop()
        second.stop()
    return True


__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
