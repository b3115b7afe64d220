"""``sweepflow.tune.utils``: Ray's ``validate_save_restore``; the rest of ``ray.tune.utils`` is Ray's own plumbing
(its object store, its GPUs), refused with what to use instead."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from sweepflow.tune.not_built import refusing

__all__ = ["validate_save_restore"]


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
