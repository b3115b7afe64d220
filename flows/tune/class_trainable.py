"""Class trainables (Ray's ``tune.Trainable``): ``setup``/``step``/``save_checkpoint``/``load_checkpoint``/
``reset_config``/``cleanup``, run as a one-rank trial whose loop is ``step()`` then ``tune.report``.

A trial builds the object, restores it from the trial's checkpoint when it restarts (``max_failures``) or
resumes, and steps it until the sweep stops the trial (a stop criterion, the scheduler, a stopper) or a result
says ``done``. Checkpoints are taken every ``checkpoint_frequency`` steps and, with ``checkpoint_at_end``, at
the step the experiment's stop criterion ends the trial on (``stop={"training_iteration": n}``,
``MaximumIterationStopper``, the scheduler's ``max_t``) or the one that says ``done``: the trial cannot be asked
for a checkpoint after the sweep stopped it, so other stops keep the latest periodic one. A step is also
checkpointed when its result says ``should_checkpoint`` (Ray's ``SHOULD_CHECKPOINT``), or when a callback's
``on_trial_result`` sets it in the step's result (before the next step). A ``save_checkpoint`` that returns a
dict has it stored and handed back to ``load_checkpoint``; one that returns None (or a path) has written files
into the directory, and ``load_checkpoint`` gets the directory.

Loads without Prefect or MLflow: this runs on the workers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ddp_runtime
from ddp_runtime import Checkpoint
from ddp_runtime.session import StopTraining, inside_training_function
from sweepflow.tasks.training.function import hold_script_modules
from sweepflow.tune import session
from sweepflow.tune.result import DONE, SHOULD_CHECKPOINT
from sweepflow.tune.shared import SharedValue

_DICT_FILE = "_sweepflow_trainable_state.pkl"  # a dict returned by save_checkpoint
_META_FILE = "_sweepflow_trainable_meta.json"  # the step count the checkpoint was taken at


class Trainable:
    """Subclass it: ``setup(config)``, ``step() -> dict``, and for checkpoints ``save_checkpoint(checkpoint_dir)``
    and ``load_checkpoint(checkpoint)``. Ray 1's names (``_setup``, ``_train``, ``_save``, ``_restore``) work too."""

    def __init__(self, config: Mapping[str, Any] | None = None, **parameters: Any) -> None:
        self.config = dict(config or {})
        self._iteration = 0
        self._started = time.time()
        self.setup(copy.deepcopy(self.config), **parameters)

    # ------------------------------------------------------------------ what a subclass defines
    def setup(self, config: dict[str, Any], **parameters: Any) -> None:
        """Build what the trial trains from ``config`` (a deep copy of the trial's config); called once per
        object.

        ``parameters`` are the objects given with ``tune.with_parameters``, as keyword arguments (Ray's
        ``setup(config, **kwargs)``). The default calls a Ray 1 ``_setup`` when the subclass has one.
        """
        legacy = getattr(self, "_setup", None)
        if legacy is not None:
            legacy(config, **parameters)

    def step(self) -> dict[str, Any]:
        """Train one iteration and return its metrics; the trial reports them (``tune.report``) after each
        step.

        Returning ``{"done": True, ...}`` ends the trial; ``{"should_checkpoint": True, ...}`` checkpoints
        this step.

        Raises:
            NotImplementedError: the subclass defines neither ``step`` nor Ray 1's ``_train``.
        """
        legacy = getattr(self, "_train", None)
        if legacy is None:
            raise NotImplementedError(f"{type(self).__name__} must define step(self) -> dict of metrics")
        return legacy()

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | str | None:
        """Write the object's state into ``checkpoint_dir``, or return it as a dict.

        A returned dict is pickled into the checkpoint and handed back to ``load_checkpoint``; returning None
        (or a path, as Ray allows) means the files written into ``checkpoint_dir`` are the checkpoint, and
        ``load_checkpoint`` gets a directory holding them. The step count is saved alongside by ``save``.

        Raises:
            NotImplementedError: a checkpoint is asked for (``checkpoint_frequency``, ``checkpoint_at_end``,
                ``should_checkpoint``) and the subclass defines neither this nor Ray 1's ``_save``.
        """
        legacy = getattr(self, "_save", None)
        if legacy is None:
            raise NotImplementedError(
                f"{type(self).__name__} is asked for a checkpoint (checkpoint_frequency / checkpoint_at_end): "
                "define save_checkpoint(self, checkpoint_dir) and load_checkpoint(self, checkpoint)"
            )
        return legacy(checkpoint_dir)

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Restore the object's state from what ``save_checkpoint`` saved: the dict it returned, or the
        directory's path.

        Called when the trial restarts (``max_failures``), resumes, or takes over a PBT exploit's checkpoint.

        Raises:
            NotImplementedError: the subclass defines neither this nor Ray 1's ``_restore``.
        """
        legacy = getattr(self, "_restore", None)
        if legacy is None:
            raise NotImplementedError(
                f"{type(self).__name__} restarts from a checkpoint: define load_checkpoint(self, checkpoint)"
            )
        legacy(checkpoint)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """With ``reuse_actors=True``, a trial that starts on a worker where a trial of this experiment ended
        offers it the object: return True once it is set up for ``new_config`` (then ``setup`` is not called
        again); False (the default) builds a new one."""
        return False

    def reset(self, new_config: Mapping[str, Any]) -> bool:
        """Ray's ``Trainable.reset``: the object taken on by a new trial, when ``reset_config`` accepts it."""
        if not self.reset_config(copy.deepcopy(dict(new_config))):
            return False
        self.config = dict(new_config)
        self._iteration = 0
        self._started = time.time()
        return True

    def cleanup(self) -> None:
        """Release what ``setup`` took (files, connections); called once when the object is done with.

        With ``reuse_actors=True`` that is when no later trial takes the object over (or the experiment ends).
        The default calls a Ray 1 ``_stop`` when the subclass has one.
        """
        legacy = getattr(self, "_stop", None)
        if legacy is not None:
            legacy()

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> Mapping[str, float] | None:
        """Resources per trial, Ray's spelling (``{"cpu": 2, "gpu": 1}``); None: the experiment's."""
        return None

    # ------------------------------------------------------------------ what Ray's Trainable also offers
    @property
    def iteration(self) -> int:
        """Steps trained so far, restored with a checkpoint (Ray's ``Trainable.iteration``)."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        """The same count as ``iteration``, under the name results use."""
        return self._iteration

    @property
    def trial_id(self) -> str:
        """The trial's id; ``"default"`` outside a trial (in ``validate_save_restore`` or a test)."""
        return (session.get_trial_id() if inside_training_function() else None) or "default"

    @property
    def trial_name(self) -> str:
        """The trial's id: unlike Ray, no separate ``<trainable>_<id>`` name is kept for the object."""
        return self.trial_id

    @property
    def logdir(self) -> str:
        """The trial's directory on its worker; the current directory outside a trial."""
        return (session.get_trial_dir() if inside_training_function() else None) or os.getcwd()

    def train(self) -> dict[str, Any]:
        """One ``step()``, with Ray's bookkeeping keys added."""
        started = time.time()
        result = self.step()
        if not isinstance(result, Mapping):
            raise TypeError(f"{type(self).__name__}.step() must return a dict of metrics, got {type(result).__name__}")
        self._iteration += 1
        now = time.time()
        return {
            **result,
            "time_this_iter_s": now - started,
            "time_total_s": now - self._started,
        }

    def save(self, checkpoint_dir: str) -> str:
        """Save into ``checkpoint_dir`` (the object's own files, or its returned dict) with the step count."""
        returned = self.save_checkpoint(checkpoint_dir)
        if isinstance(returned, Mapping):
            with open(os.path.join(checkpoint_dir, _DICT_FILE), "wb") as f:
                pickle.dump(dict(returned), f)
        with open(os.path.join(checkpoint_dir, _META_FILE), "w") as f:
            json.dump({"iteration": self._iteration}, f)
        return checkpoint_dir

    def restore(self, checkpoint_dir: str) -> None:
        """Restore from a directory ``save`` wrote: calls ``load_checkpoint`` and sets ``iteration`` back.

        Args:
            checkpoint_dir: the checkpoint's local directory (Ray also takes a ``Checkpoint`` object; here,
                use ``checkpoint.as_directory()``).
        """
        saved = os.path.join(checkpoint_dir, _DICT_FILE)
        if os.path.exists(saved):
            with open(saved, "rb") as f:
                self.load_checkpoint(pickle.load(f))
        else:
            self.load_checkpoint(checkpoint_dir)
        meta = os.path.join(checkpoint_dir, _META_FILE)
        if os.path.exists(meta):
            with open(meta) as f:
                self._iteration = int(json.load(f)["iteration"])

    def stop(self) -> None:
        """End the object: calls ``cleanup`` (Ray's ``Trainable.stop``)."""
        self.cleanup()


# reuse_actors: the object of the last trial that ended on this worker, by experiment (``reuse_token``), for the
# next trial here to take on (``reset``), with the hold that keeps its script's modules loaded while it waits
# (``hold_script_modules``: else the next trial imports them anew, and the object's classes are no longer the
# ones pickle finds). A worker runs one rank at a time, but the lock keeps the handover whole.
_IDLE: dict[str, tuple[Trainable, Callable[[], None]]] = {}
_IDLE_LOCK = threading.Lock()


def _take_idle(token: str, config: Mapping[str, Any]) -> Trainable | None:
    with _IDLE_LOCK:
        parked = _IDLE.pop(token, None)
    if parked is None:
        return None
    idle, release = parked
    try:
        if idle.reset(config):
            return idle  # this trial's own hold on the script's modules is open: the parked one can go
        idle.stop()  # it declined the new config: cleaned up as if it were not reused
        return None
    finally:
        release()


def _park(token: str, trainable: Trainable) -> None:
    hold = hold_script_modules()
    with _IDLE_LOCK:
        previous, _IDLE[token] = _IDLE.get(token), (trainable, hold)
    if previous is not None:
        _end(previous)


def _end(parked: tuple[Trainable, Callable[[], None]]) -> None:
    trainable, release = parked
    try:
        trainable.stop()
    finally:
        release()


def release_idle(token: str) -> int:
    """Run on every worker when the experiment ends: the object it kept for reuse is cleaned up (``cleanup``).
    Returns how many were."""
    with _IDLE_LOCK:
        parked = _IDLE.pop(token, None)
    if parked is None:
        return 0
    _end(parked)
    return 1


def is_class_trainable(trainable: Any) -> bool:
    """Whether ``trainable`` is a ``Trainable`` subclass (a class trainable), not a function."""
    return isinstance(trainable, type) and issubclass(trainable, Trainable)


@dataclasses.dataclass(frozen=True)
class ClassTrainableRun:
    """What each trial of a class trainable runs (on its one rank): build, restore, step and report."""

    cls: type[Trainable]
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)  # with_parameters: given to setup
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool = False
    end_at: int = 0  # the step the stop criterion ends every trial on (0: not known)
    reuse_token: str | None = None  # reuse_actors: the experiment's key for objects kept between its trials

    def ending_at(self, end_at: int) -> ClassTrainableRun:
        """The same, knowing the step every trial ends on (for ``checkpoint_at_end``)."""
        return dataclasses.replace(self, end_at=end_at)

    def sharing(self, shared: Mapping[str, Any]) -> ClassTrainableRun:
        """The same, with its ``with_parameters`` objects replaced by their copies on the cluster."""
        return dataclasses.replace(self, parameters=dict(shared))

    def _save_now(self, iteration: int, done: bool) -> bool:
        if self.checkpoint_frequency and iteration % self.checkpoint_frequency == 0:
            return True
        return self.checkpoint_at_end and (done or iteration == self.end_at)

    def __call__(self, config: dict[str, Any]) -> None:
        trainable = _take_idle(self.reuse_token, config) if self.reuse_token else None
        if trainable is None:
            kwargs = {name: v.get() if isinstance(v, SharedValue) else v for name, v in self.parameters.items()}
            trainable = self.cls(config, **kwargs)
        ended_cleanly = False  # done, or stopped by the sweep: the object may serve the next trial here
        try:
            checkpoint = session.get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as directory:
                    trainable.restore(directory)
            while True:
                result = trainable.train()
                done = bool(result.pop(DONE, False))
                asked = bool(result.pop(SHOULD_CHECKPOINT, False))  # Ray: the step asks for its checkpoint
                if asked or self._save_now(trainable.iteration, done):
                    directory = tempfile.mkdtemp(prefix="sweepflow-trainable-")
                    try:
                        trainable.save(directory)
                        session.report(result, checkpoint=Checkpoint.from_directory(directory))
                    finally:
                        shutil.rmtree(directory, ignore_errors=True)
                else:
                    # A callback that sets result["should_checkpoint"] gets this step saved before the next one.
                    ddp_runtime.report(result, checkpoint_on_request=trainable.save)
                if done:
                    ended_cleanly = True
                    return
        except StopTraining:
            ended_cleanly = True
            raise
        finally:
            if ended_cleanly and self.reuse_token:
                _park(self.reuse_token, trainable)
            else:
                trainable.stop()
