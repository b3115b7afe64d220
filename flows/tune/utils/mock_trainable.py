"""``sweepflow.tune.utils.mock_trainable.MyTrainableClass``: the test trainable Ray's examples import
(``ray.tune.utils.mock_trainable``), written here for sweepflow: each step reports ``episode_reward_mean`` =
``height * tanh(step / width)`` (config keys ``width``, ``height``, default 1) -- a curve that rises and flattens,
whose ceiling the config sets -- and ``timesteps_this_iter``; checkpoints hold the step count (``ckpt.json``), so
HyperBand's pauses, PBT's exploits and restarts continue where they left off."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from sweepflow.tune.class_trainable import Trainable

__all__ = ["MyTrainableClass"]


class MyTrainableClass(Trainable):
    """A quick-to-train trainable for trying schedulers and searchers (``config``: ``width``, ``height``)."""

    def setup(self, config: dict[str, Any]) -> None:
        """Start at step 0 (``width`` and ``height`` are read from ``self.config`` at each step)."""
        self.timestep = 0

    def step(self) -> dict[str, Any]:
        """One step: ``episode_reward_mean`` = ``height * tanh(step / width)``, and ``timesteps_this_iter`` =
        1.
        """
        self.timestep += 1
        value = math.tanh(self.timestep / float(self.config.get("width", 1)))
        return {"episode_reward_mean": value * float(self.config.get("height", 1)), "timesteps_this_iter": 1}

    def save_checkpoint(self, checkpoint_dir: str) -> str:
        """Write the step count to ``ckpt.json`` in ``checkpoint_dir``."""
        path = os.path.join(checkpoint_dir, "ckpt.json")
        with open(path, "w") as f:
            json.dump({"timestep": self.timestep}, f)
        return checkpoint_dir

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Read the step count back from ``ckpt.json``."""
        with open(os.path.join(str(checkpoint), "ckpt.json")) as f:
            self.timestep = json.load(f)["timestep"]
