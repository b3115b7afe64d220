"""Ray SGD's creator-style ``PyTorchTrainer`` and ``PyTorchTrainable`` (Ray 0.7.x-0.8.x,
``ray.experimental.sgd.pytorch`` / ``ray.util.sgd.pytorch``) on ddp_runtime's DDP groups.

A Ray script changes only its import::

    from sweepflow.sgd.pytorch import PyTorchTrainer  # was: from ray.experimental.sgd.pytorch import ...

    trainer = PyTorchTrainer(model_creator, data_creator, optimizer_creator, loss_creator=nn.MSELoss,
                             num_replicas=2, batch_size=512)
    stats = trainer.train()          # one epoch on every replica: {"train_loss": ..., "epoch": 1, ...}
    trainer.validate()               # {"validation_loss": ..., "mean_accuracy": ..., ...}
    model = trainer.get_model()      # the trained nn.Module, on the CPU
    trainer.save(path); trainer.restore(path); trainer.shutdown()

Ray kept one actor per replica alive between calls. Here each ``train()``/``validate()`` is one short DDP group
(``ddp_runtime.torch.TorchTrainer``) of ``num_replicas`` ranks: every rank builds the model, optimizer, loss and
data with the creators, loads the trainer's state (model and optimizer ``state_dict``s, epoch) from a checkpoint,
runs one epoch, averages the stats across ranks, and rank 0 reports them with the new state as a checkpoint.
The state lives in a directory the trainer owns (a temporary one by default), removed by ``shutdown()``.

Creators are called as Ray called them: ``model_creator(config)``, ``optimizer_creator(model, config)``,
``loss_creator(config)`` or a loss class, ``data_creator(batch_size, config)`` (Ray 0.8) or
``data_creator(config)`` (Ray 0.7), returning a Dataset or DataLoader, or a (train, validation) pair of them.
``batch_size`` is the global batch: each replica gets ``batch_size // num_replicas``, as in Ray.

This module holds the driver classes. The argument checks and the plan they build are in
``sweepflow.sgd.plan``; what runs on the workers (the ranks' epochs, Ray's default ``train``/``validate``) in
``sweepflow.sgd.replica``; the state file's format in ``sweepflow.sgd.state``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import fsspec

from ddp_runtime import Checkpoint, RunConfig, ScalingConfig, TorchConfig
from ddp_runtime.torch import TorchTrainer
from sweepflow.sgd.plan import check_trainable_config, make_plan
from sweepflow.sgd.replica import (
    setup_trainer,
    sgd_mse_optimizer,
    train,
    trainable_rank,
    trainer_rank,
    validate,
)
from sweepflow.sgd.state import STATE_FILE, load_models, read_state, read_state_file, state_bytes

__all__ = ["PyTorchTrainable", "PyTorchTrainer", "sgd_mse_optimizer", "train", "validate"]


def _remove_tree(path: str | None, storage_options: dict[str, Any] | None) -> None:
    if not path:
        return
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    with contextlib.suppress(FileNotFoundError):
        fs.rm(root, recursive=True)


class PyTorchTrainer:
    """Train a PyTorch model with ``num_replicas`` DDP replicas on a Dask cluster (Ray's ``PyTorchTrainer``).

    Uses the current Dask client (``distributed.default_client()``); with none, starts a local cluster of
    ``num_replicas`` worker processes that ``shutdown()`` closes. ``storage_path``/``storage_options``
    (sweepflow only) put the trainer's state on shared storage (fsspec URI) for clusters spanning hosts;
    by default it is a temporary directory on this host.
    """

    def __init__(
        self,
        model_creator: Callable[[dict[str, Any]], Any],
        data_creator: Callable[..., Any],
        optimizer_creator: Callable[[Any, dict[str, Any]], Any] | None = None,
        loss_creator: Any = None,
        train_function: Callable[..., dict[str, Any]] | None = None,
        validation_function: Callable[..., dict[str, Any]] | None = None,
        initialization_hook: Callable[..., Any] | None = None,
        config: dict[str, Any] | None = None,
        num_replicas: int = 1,
        use_gpu: bool = False,
        batch_size: int = 16,
        backend: str = "auto",
        *,
        storage_path: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._plan = make_plan(
            model_creator=model_creator,
            data_creator=data_creator,
            optimizer_creator=optimizer_creator,
            loss_creator=loss_creator,
            train_function=train_function,
            validation_function=validation_function,
            initialization_hook=initialization_hook,
            config=config,
            num_replicas=num_replicas,
            use_gpu=use_gpu,
            batch_size=batch_size,
            backend=backend,
        )
        self.config = self._plan.config
        self._storage_options = dict(storage_options or {}) or None
        if storage_path is None:
            self._root = tempfile.mkdtemp(prefix="sweepflow-sgd-")
        else:
            self._root = f"{storage_path.rstrip('/')}/sweepflow-sgd-{uuid.uuid4().hex[:12]}"
        self._remove_root = weakref.finalize(self, _remove_tree, self._root, self._storage_options)
        self._stack = contextlib.ExitStack()
        self._closed = False
        self._calls = 0
        self._state: Checkpoint | None = None
        self._state_home: str | None = None
        try:
            self._client = self._connect()
            setup = self._client.submit(setup_trainer, self._plan, pure=False).result()
            self._has_validation = setup["has_validation"]
            self._put_state(setup["state"])
        except BaseException:
            self.shutdown()
            raise

    # -------------------------------------------------------------------------------------------- cluster

    def _connect(self) -> Any:
        from distributed import default_client

        try:
            return default_client()
        except ValueError:
            pass  # no client in this process: start a cluster for this trainer
        from ddp_runtime.cluster import gpu_local_cluster, local_cluster

        if self._plan.use_gpu:  # one worker per replica, each pinned to a GPU of its own
            return self._stack.enter_context(gpu_local_cluster(n_workers=self._plan.num_replicas))
        return self._stack.enter_context(local_cluster(n_workers=self._plan.num_replicas))

    # ---------------------------------------------------------------------------------------------- state

    def _put_state(self, data: bytes) -> None:
        """Make ``data`` (a torch.save'd state) the trainer's state: a new directory under the root."""
        self._calls += 1
        home = f"{self._root}/state-{self._calls:04d}"
        fs, path = fsspec.core.url_to_fs(home, **(self._storage_options or {}))
        fs.makedirs(path, exist_ok=True)
        fs.pipe_file(f"{path}/{STATE_FILE}", data)
        self._set_state(Checkpoint(home, storage_options=self._storage_options), home)

    def _set_state(self, checkpoint: Checkpoint, home: str) -> None:
        previous, self._state, self._state_home = self._state_home, checkpoint, home
        _remove_tree(previous, self._storage_options)

    def _current_state(self) -> dict[str, Any]:
        self._check_open()
        assert self._state is not None
        return read_state(self._state)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this PyTorchTrainer was shut down; create a new one")

    # ----------------------------------------------------------------------------------------------- runs

    def _run_group(self, mode: str) -> dict[str, Any]:
        self._check_open()
        self._calls += 1
        name = f"{mode}-{self._calls:04d}"
        plan = self._plan
        try:
            result = TorchTrainer(
                trainer_rank,
                train_loop_config={"plan": plan, "mode": mode},
                scaling_config=ScalingConfig(num_workers=plan.num_replicas, use_gpu=plan.use_gpu),
                run_config=RunConfig(
                    name=name, storage_path=self._root, storage_options=self._storage_options
                ),
                torch_config=TorchConfig(backend=plan.backend),
                resume_from_checkpoint=self._state,
                client=self._client,
            ).fit()
        except BaseException:
            _remove_tree(f"{self._root}/{name}", self._storage_options)
            raise
        stats = dict((result.metrics or {}).get("stats") or {})
        if mode == "train":
            if result.checkpoint is None:
                raise RuntimeError(f"the training group {name} ended without reporting its state")
            self._set_state(result.checkpoint, result.path)
        else:
            _remove_tree(result.path, self._storage_options)
        return stats

    def train(self) -> dict[str, Any]:
        """Runs one training epoch on every replica; returns the stats averaged over replicas
        (``train_loss``, ``epoch``, ``batch_processed``, ``batch_time``, ``data_time`` with the default
        ``train_function``)."""
        return self._run_group("train")

    def validate(self) -> dict[str, Any]:
        """Evaluates the model on the validation set on every replica; returns the averaged stats
        (``validation_loss``, ``mean_accuracy``, ``batch_time``, ``epoch`` with the default function)."""
        self._check_open()
        if not self._has_validation:
            raise ValueError(
                "No validation dataloader provided: data_creator returned only a training set; "
                "return (train, validation) from data_creator to use validate()"
            )
        return self._run_group("validate")

    def get_model(self) -> Any:
        """The trained model(s), built by ``model_creator(config)`` on this process, on the CPU."""
        state = self._current_state()
        created = self._plan.model_creator(self._plan.config)
        load_models(list(created) if isinstance(created, tuple | list) else [created], state)
        return created

    def save(self, checkpoint: str | os.PathLike[str]) -> str | os.PathLike[str]:
        """Saves the model(s), optimizer(s) and epoch to the file ``checkpoint`` (torch.save); returns it."""
        self._check_open()
        assert self._state is not None
        with self._state.as_directory() as directory:
            shutil.copyfile(os.path.join(directory, STATE_FILE), checkpoint)
        return checkpoint

    def restore(self, checkpoint: str | os.PathLike[str] | Checkpoint) -> None:
        """Restores the state saved by ``save(checkpoint)`` (also a file saved by Ray's PyTorchTrainer), or a
        ``PyTorchTrainable`` trial's checkpoint: its directory (``trial.checkpoint.value``) or ``Checkpoint``."""
        self._check_open()
        if isinstance(checkpoint, Checkpoint):
            state = read_state(checkpoint)
        else:
            path = os.fspath(checkpoint)
            if os.path.isdir(path):
                if not os.path.isfile(os.path.join(path, STATE_FILE)):
                    raise ValueError(
                        f"{path!r} is a directory without {STATE_FILE}: not a PyTorchTrainable checkpoint; "
                        "restore a trial's checkpoint directory or a file written by PyTorchTrainer.save"
                    )
                path = os.path.join(path, STATE_FILE)
            state = read_state_file(path)
        created = self._plan.model_creator(self._plan.config)
        load_models(
            list(created) if isinstance(created, tuple | list) else [created], state
        )  # fails here on a mismatch
        self._put_state(state_bytes(state))

    def shutdown(self) -> None:
        """Removes the trainer's state and closes the cluster it started (not a cluster it found)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._remove_root()
        finally:
            self._stack.close()

    def __enter__(self) -> PyTorchTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class PyTorchTrainable:
    """Ray's Tune trainable for ``PyTorchTrainer``: ``tune.run(PyTorchTrainable, config={...})`` where the
    config holds PyTorchTrainer's arguments (``model_creator``, ``data_creator``, ``optimizer_creator``,
    ``loss_creator``, ``num_replicas``, ``use_gpu``, ``batch_size``, ``backend``, ``config``, ...).

    Each trial is one DDP group of ``num_replicas`` ranks that trains epoch after epoch, reporting train and
    validation stats with a checkpoint every epoch, until Tune stops it (stop criteria, a scheduler) or
    after ``config["epochs"]`` epochs (sweepflow only); a restarted trial resumes from its checkpoint.
    """

    @classmethod
    def _sweepflow_trial_template(cls, config_example: dict[str, Any] | None) -> dict[str, Any]:
        n, use_gpu = check_trainable_config(config_example)
        return {
            "function": trainable_rank,
            "num_ranks": n,
            "resources_per_rank": {"CPU": 1, "GPU": 1 if use_gpu else 0},
            "use_gpu": use_gpu,
        }
