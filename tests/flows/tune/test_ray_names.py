"""Every Ray 2.60 public name a script imports from ``ray.tune``, ``ray.train``, ``ray.train.torch``, ``ray.air`` and
the modules the docs map is either here or refused in one sentence naming the Ray name, why it is not here and what
to use: never a bare "cannot import name" / ``AttributeError`` / ``ModuleNotFoundError``. The list is ours, taken from
the ``__all__`` of Ray 2.60's modules (``ray.train``'s with Ray Train v2 on, its default); a name built later moves
from refused to present by itself."""

from __future__ import annotations

import importlib

import pytest

from sweepflow.tune import Trainable

RAY_2_60 = {
    "ray.tune": [
        "Trainable", "Callback", "TuneError", "grid_search", "register_env", "register_trainable", "run",
        "run_experiments", "with_parameters", "with_resources", "Stopper", "Experiment", "sample_from", "uniform",
        "quniform", "choice", "randint", "lograndint", "qrandint", "qlograndint", "randn", "qrandn", "loguniform",
        "qloguniform", "ExperimentAnalysis", "CLIReporter", "JupyterNotebookReporter", "ProgressReporter",
        "ResultGrid", "create_searcher", "create_scheduler", "PlacementGroupFactory", "Tuner", "TuneConfig",
        "ResumeConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "Result", "Checkpoint", "get_checkpoint",
        "report", "get_context", "TuneContext", "SyncConfig",
        # Ray 1 / early Ray 2 names a ported script still has
        "checkpoint_dir", "get_trial_dir", "get_trial_id",
    ],
    "ray.tune.schedulers": [
        "TrialScheduler", "HyperBandScheduler", "AsyncHyperBandScheduler", "ASHAScheduler", "MedianStoppingRule",
        "FIFOScheduler", "PopulationBasedTraining", "PopulationBasedTrainingReplay", "HyperBandForBOHB",
        "ResourceChangingScheduler", "create_scheduler", "PB2",
    ],
    "ray.tune.search": [
        "SearchAlgorithm", "Searcher", "ConcurrencyLimiter", "Repeater", "BasicVariantGenerator", "grid_search",
        "SearchGenerator", "create_searcher", "HyperOptSearch", "BayesOptSearch", "AxSearch", "HEBOSearch",
        "NevergradSearch", "ZOOptSearch", "TuneBOHB",
    ],
    "ray.tune.stopper": [
        "Stopper", "CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper",
        "NoopStopper", "TimeoutStopper", "TrialPlateauStopper",
    ],
    "ray.tune.logger": [
        "LoggerCallback", "pretty_print", "CSVLoggerCallback", "JsonLoggerCallback", "TBXLoggerCallback", "Logger",
        "CSVLogger", "JsonLogger", "TBXLogger", "LegacyLoggerCallback", "NoopLogger",
    ],
    "ray.tune.result": [
        "TRAINING_ITERATION", "TIME_TOTAL_S", "TIME_THIS_ITER_S", "DONE", "SHOULD_CHECKPOINT", "TRIAL_ID",
        "EXPERIMENT_TAG", "TIMESTAMP", "MEAN_ACCURACY", "MEAN_LOSS", "EPISODE_REWARD_MEAN", "TIMESTEPS_TOTAL",
        "HOSTNAME", "NODE_IP", "PID",
    ],
    "ray.tune.experiment": ["Experiment", "Trial"],
    "ray.tune.callback": ["Callback"],
    "ray.tune.utils": [
        "flatten_dict", "merge_dicts", "unflattened_lookup", "date_str", "deep_update", "UtilMonitor", "warn_if_slow",
        "validate_save_restore", "pin_in_object_store", "get_pinned_object", "wait_for_gpu", "diagnose_serialization",
    ],
    "ray.tune.utils.mock_trainable": ["MyTrainableClass"],
    # Ray's own module paths for names built or refused above: the import works, the name is there or refused.
    "ray.tune.schedulers.pb2": ["PB2"],
    "ray.tune.schedulers.hb_bohb": ["HyperBandForBOHB"],
    "ray.tune.search.optuna": ["OptunaSearch"],
    "ray.tune.search.ax": ["AxSearch"],
    "ray.tune.search.bayesopt": ["BayesOptSearch"],
    "ray.tune.search.bohb": ["TuneBOHB"],
    "ray.tune.search.hyperopt": ["HyperOptSearch"],
    "ray.tune.search.nevergrad": ["NevergradSearch"],
    "ray.tune.search.hebo": ["HEBOSearch"],
    "ray.tune.search.zoopt": ["ZOOptSearch"],
    "ray.tune.integration.ray_train": ["TuneReportCallback"],
    "ray.tune.integration.pytorch_lightning": ["TuneReportCallback", "TuneReportCheckpointCallback"],
    "ray.tune.integration.keras": ["TuneReportCallback", "TuneReportCheckpointCallback"],
    "ray.train": [
        "get_checkpoint", "get_context", "get_dataset_shard", "report", "BackendConfig", "Checkpoint",
        "CheckpointConfig", "DataConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "SyncConfig",
        "TrainContext", "TrainingFailedError", "TRAIN_DATASET_KEY",
        # Ray Train v2's (the default in 2.60)
        "CheckpointUploadMode", "CheckpointConsistencyMode", "ControllerError", "NCCLHangError", "LoggingConfig",
        "PreemptionError", "PreemptionInfo", "ReportedCheckpoint", "ReportedCheckpointStatus", "UserCallback",
        "WorkerGroupError", "ValidationConfig", "ValidationFn", "ValidationTaskConfig",
        "get_all_reported_checkpoints", "get_preemption_info",
    ],
    "ray.train.torch": [
        "TorchTrainer", "TorchCheckpoint", "TorchConfig", "accelerate", "get_device", "get_devices", "prepare_model",
        "prepare_optimizer", "prepare_data_loader", "backward", "enable_reproducibility",
    ],
    "ray.train.collective": ["broadcast_from_rank_zero", "barrier"],
    "ray.train.lightning": [
        "prepare_trainer", "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy", "RayLightningEnvironment",
        "RayTrainReportCallback",
    ],
    "ray.train.huggingface.transformers": ["RayTrainReportCallback", "prepare_trainer"],
    "ray.air": [
        "DataBatchType", "RunConfig", "Result", "ScalingConfig", "FailureConfig", "CheckpointConfig",
        "AcquiredResources", "ResourceRequest", "session", "DatasetConfig",
    ],
    "ray.air.integrations.mlflow": ["MLflowLoggerCallback", "setup_mlflow"],
    "ray.air.integrations.wandb": ["WandbLoggerCallback", "setup_wandb"],
    "ray.air.integrations.comet": ["CometLoggerCallback"],
}

#: Ray's module -> ours, longest prefix first (docs/coming-from-ray.md's import changes).
MODULES = {
    "ray.train.torch": "ddp_runtime.torch",
    "ray.train.collective": "ddp_runtime.collective",
    "ray.train.lightning": "ddp_runtime.lightning",
    "ray.train.huggingface.transformers": "ddp_runtime.huggingface.transformers",
    "ray.train": "ddp_runtime",
    "ray.tune": "sweepflow.tune",
    "ray.air": "sweepflow.air",
}

#: What a refusal's fix starts with: it says what to do.
FIX_WORDS = ("use ", "pass ", "read ", "give ", "call ", "repeat ", "catch ", "configure ", "save ", "validate ")


def ours(ray_module: str) -> str:
    for prefix, module in MODULES.items():
        if ray_module == prefix or ray_module.startswith(prefix + "."):
            return module + ray_module[len(prefix) :]
    raise AssertionError(f"no mapping for {ray_module}")


@pytest.mark.parametrize(
    "ray_module,name", [(m, n) for m, names in RAY_2_60.items() for n in names], ids=lambda v: str(v)
)
def test_a_ray_name_is_here_or_refused_in_one_sentence(ray_module, name):
    module = ours(ray_module)
    imported = importlib.import_module(module)  # never a bare ModuleNotFoundError for a mapped Ray module
    try:
        getattr(imported, name)
    except ImportError as exc:  # refused: says which Ray name, why, and what to use instead
        message = str(exc)
        assert message.startswith(f"{ray_module}.{name}"), message
        assert "\n" not in message, message
        assert any(word in message for word in FIX_WORDS), message
        with pytest.raises(ImportError, match=name):  # the same for `from ... import name`
            exec(f"from {module} import {name}", {})
    except AttributeError as exc:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"{module}.{name}: a bare AttributeError ({exc}); build it or refuse it with the fix")


def test_the_list_names_every_name_of_rays_all():
    """Ray 2.60's ``__all__`` of the modules a script imports from, as read from its wheel, are all listed above."""
    listed = {(m, n) for m, names in RAY_2_60.items() for n in names}
    for module, names in RAY_ALL.items():
        assert {(module, n) for n in names} <= listed, sorted({(module, n) for n in names} - listed)


#: ``__all__`` of Ray 2.60's modules, read from the ``ray-2.60.0`` wheel (``ray.train``'s base list; the v2 names
#: are listed above by hand from its ``if is_v2_enabled():`` block).
RAY_ALL = {
    "ray.train": [
        "get_checkpoint", "get_context", "get_dataset_shard", "report", "BackendConfig", "Checkpoint",
        "CheckpointConfig", "DataConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "SyncConfig",
        "TrainContext", "TrainingFailedError", "TRAIN_DATASET_KEY",
    ],
    "ray.train.torch": [
        "TorchTrainer", "TorchCheckpoint", "TorchConfig", "accelerate", "get_device", "get_devices", "prepare_model",
        "prepare_optimizer", "prepare_data_loader", "backward", "enable_reproducibility",
    ],
    "ray.air": [
        "DataBatchType", "RunConfig", "Result", "ScalingConfig", "FailureConfig", "CheckpointConfig",
        "AcquiredResources", "ResourceRequest",
    ],
    "ray.train.collective": ["broadcast_from_rank_zero", "barrier"],
    "ray.train.lightning": [
        "prepare_trainer", "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy", "RayLightningEnvironment",
        "RayTrainReportCallback",
    ],
    "ray.train.huggingface.transformers": ["RayTrainReportCallback", "prepare_trainer"],
    "ray.tune.schedulers": [
        "TrialScheduler", "HyperBandScheduler", "AsyncHyperBandScheduler", "ASHAScheduler", "MedianStoppingRule",
        "FIFOScheduler", "PopulationBasedTraining", "PopulationBasedTrainingReplay", "HyperBandForBOHB",
        "ResourceChangingScheduler",
    ],
    "ray.tune.stopper": [
        "Stopper", "CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper",
        "NoopStopper", "TimeoutStopper", "TrialPlateauStopper",
    ],
    "ray.tune.logger": ["LoggerCallback", "pretty_print", "CSVLoggerCallback", "JsonLoggerCallback", "TBXLoggerCallback"],
}


def test_ray_module_paths_are_reachable_as_attributes_too():
    from sweepflow import tune

    assert tune.result.SHOULD_CHECKPOINT == "should_checkpoint"  # Ray: an alias of the string
    assert tune.utils.validate_save_restore is not None
    assert tune.schedulers.ASHAScheduler is not None  # the module that became a package still has its names
    from sweepflow.tune.schedulers import resolve

    assert type(resolve(None)).__name__ == "FIFOScheduler"


def test_create_scheduler_and_create_searcher_build_rays_names_and_refuse_what_ray_would_drop():
    from sweepflow import tune
    from sweepflow.tune.schedulers import ASHAScheduler, PopulationBasedTraining
    from sweepflow.tune.search import BasicVariantGenerator
    from sweepflow.tune.search.optuna import OptunaSearch

    asha = tune.create_scheduler("async_hyperband", metric="loss", mode="min", max_t=5)
    assert isinstance(asha, ASHAScheduler) and asha.max_t == 5
    pbt = tune.create_scheduler("PBT", metric="loss", mode="min", hyperparam_mutations={"lr": [0.1, 0.01]})
    assert isinstance(pbt, PopulationBasedTraining)
    assert isinstance(tune.create_searcher("random"), BasicVariantGenerator)
    assert isinstance(tune.create_searcher("optuna", metric="loss", mode="min"), OptunaSearch)
    with pytest.raises(ValueError, match=r"must be one of \['fifo', 'async_hyperband'"):
        tune.create_scheduler("asha")  # not one of Ray's names either
    with pytest.raises(ValueError, match="FIFOScheduler takes no metric .*it takes none"):
        tune.create_scheduler("fifo", metric="loss")
    with pytest.raises(ImportError, match=r"^ray.tune.schedulers.PopulationBasedTrainingReplay: "):
        tune.create_scheduler("pbt_replay")
    from sweepflow.tune.search.hyperopt import HyperOptSearch

    assert isinstance(tune.create_searcher("hyperopt", metric="loss", mode="min"), HyperOptSearch)
    from sweepflow.tune.search.ax import AxSearch

    assert isinstance(tune.create_searcher("ax", metric="loss", mode="min"), AxSearch)


def test_rays_dict_helpers_and_pretty_print():
    import numpy as np

    from sweepflow.tune.logger import pretty_print
    from sweepflow.tune.utils import date_str, flatten_dict, merge_dicts, unflattened_lookup

    assert flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": [1], "f": {}}) == {"a/b": 1, "a/c/d": 2, "e": [1], "f": {}}
    with pytest.raises(ValueError, match="holds the delimiter"):
        flatten_dict({"a/b": 1}, prevent_delimiter=True)
    original = {"a": {"b": 1}, "x": 1}
    assert merge_dicts(original, {"a": {"c": 2}, "x": 2}) == {"a": {"b": 1, "c": 2}, "x": 2}
    assert original == {"a": {"b": 1}, "x": 1}
    assert unflattened_lookup("a/1/b", {"a": [0, {"b": 5}]}) == 5
    assert len(date_str()) == len("2026-12-01_23-59-59")
    text = pretty_print({"loss": np.float64(0.5), "i": np.int64(3), "config": {"lr": 1}, "arr": np.zeros(2), "n": None})
    assert text == "arr: '[0. 0.]'\ni: 3\nloss: 0.5\n"


class _Counter(Trainable):
    def setup(self, config):
        self.count = config.get("start", 0)

    def step(self):
        self.count += 1
        return {"count": self.count}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        self.count = checkpoint["count"]


class _Forgetful(_Counter):
    def restore(self, checkpoint_dir):  # does not restore its step count: a restored trial would start over
        pass


def test_validate_save_restore_round_trips_a_class_trainable_and_names_what_breaks():
    from sweepflow.tune.utils import validate_save_restore

    assert validate_save_restore(_Counter, {"start": 10}) is True
    with pytest.raises(AssertionError, match="_Forgetful restored from its checkpoint after step 3 is at step 1"):
        validate_save_restore(_Forgetful)
    with pytest.raises(TypeError, match="subclass of sweepflow.tune.Trainable"):
        validate_save_restore(print)


def test_tuner_restore_of_a_path_without_an_experiment_says_which_path_to_give(tmp_path):
    from sweepflow import tune

    assert tune.Tuner.can_restore(str(tmp_path)) is False
    with pytest.raises(ValueError, match="Experiment path"):
        tune.Tuner.restore(str(tmp_path), trainable=print)


def test_my_trainable_class_climbs_to_its_height_and_continues_from_its_checkpoint(tmp_path):
    """Ray's examples' test trainable: ``height * tanh(step / width)``, its step count in its checkpoint."""
    import math

    from sweepflow.tune.utils.mock_trainable import MyTrainableClass

    trainable = MyTrainableClass({"width": 2, "height": 10})
    rewards = [trainable.train()["episode_reward_mean"] for _ in range(3)]
    assert rewards == pytest.approx([10 * math.tanh(step / 2) for step in (1, 2, 3)])
    assert rewards == sorted(rewards) and rewards[-1] < 10
    trainable.save(str(tmp_path))
    again = MyTrainableClass({"width": 2, "height": 10})
    again.restore(str(tmp_path))
    assert again.train()["episode_reward_mean"] == pytest.approx(10 * math.tanh(4 / 2))
