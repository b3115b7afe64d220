"""Ray Tune names sweepflow does not have (yet): asking for one raises an ``ImportError`` that names the Ray
feature, says why it is not here, and gives the nearest equivalent, never a bare "cannot import name".

Each ``sweepflow.tune`` module that mirrors a Ray module ends with ``__getattr__ = refusing(__name__)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_HEBO = (
    "HEBOSearch is not built: HEBO 0.3.6, the newest release, requires numpy<1.25 (and pymoo==0.6.0), so it "
    "cannot be installed beside sweepflow's numpy 2; use sweepflow.tune.search.zoopt.ZOOptSearch, "
    "sweepflow.tune.search.optuna.OptunaSearch or sweepflow.tune.search.nevergrad.NevergradSearch"
)
_LOGGER = (
    "is not needed: every trial is already an MLflow run (params, every reported metric, checkpoints, status), "
    "and the experiment an MLflow parent run; read them in the MLflow UI or with mlflow.search_runs"
)

#: sweepflow module -> Ray name -> why it is not here and what to use.
NOT_BUILT: dict[str, dict[str, str]] = {
    "sweepflow.tune": {
        "Experiment": "tune.Experiment specs are not supported; call tune.run(trainable, config=..., ...) or "
        "Tuner(...).fit() once per experiment",
        "run_experiments": "tune.run_experiments is not supported; call tune.run once per experiment",
        "register_trainable": "there is no trainable registry: pass the function or class itself to tune.run/Tuner",
        "register_env": "there is no RLlib environment registry here: sweepflow tunes PyTorch training functions; "
        "give your trainable the code that builds its environment",
        "SyncConfig": "there is nothing to sync: checkpoints go to MLflow's artifact store (local or S3) directly; "
        "give RunConfig(storage_path=...) or the tracking server's artifact root instead",
        "ProgressReporter": "use sweepflow.tune.CLIReporter (the table is printed when the experiment ends)",
        "ResumeConfig": "ResumeConfig is not built; give its choices to Tuner.restore(path, trainable, resume_errored=..., "
        "restart_errored=...): finished trials are read back and unfinished ones continue from their checkpoints",
        **{
            name: f"tune.{name} is not built; {fix}"
            for name, fix in (
                ("qloguniform", "use tune.loguniform(lower, upper) and round to q in the trainable, or tune.choice "
                 "over the values"),
                ("lograndint", "use tune.choice over the integers (e.g. powers of two), or tune.loguniform and "
                 "int() in the trainable"),
                ("qlograndint", "use tune.choice over the integers, or tune.loguniform and round in the trainable"),
                ("qrandn", "use tune.randn(mean, sd) and round to q in the trainable"),
            )
        },
    },
    "sweepflow.tune.schedulers": {
        "PopulationBasedTrainingReplay": "replaying a PBT policy is not built; use PopulationBasedTraining, and read "
        "each trial's config history in its MLflow run (pbt/config_history.json)",
        "ResourceChangingScheduler": "trials keep the resources they started with; give them per trial with "
        "tune.with_resources",
    },
    # Ray's own module paths for the same names (its examples import from them).
    "sweepflow.tune.search": {
        "SearchAlgorithm": "is Ray's internal layer under a searcher; use a subclass of "
        "sweepflow.tune.search.Searcher (suggest, on_trial_complete) instead",
        "SearchGenerator": "is Ray's internal wrapper of a Searcher; pass your sweepflow.tune.search.Searcher "
        "subclass itself as search_alg",
        "HEBOSearch": _HEBO,
    },
    "sweepflow.tune.result": {
        name: "results carry no host or process fields; report them yourself: call tune.report({..., "
        f"{field!r}: {how}}})"
        for name, field, how in (
            ("HOSTNAME", "hostname", "socket.gethostname()"),
            ("NODE_IP", "node_ip", "socket.gethostbyname(socket.gethostname())"),
            ("PID", "pid", "os.getpid()"),
        )
    },
    "sweepflow.tune.utils": {
        "pin_in_object_store": "is Tune's old object store helper; call ddp_runtime.put(obj) (ray.put), or pass "
        "large objects with tune.with_parameters(trainable, name=obj), sent to every worker once",
        "get_pinned_object": "is Tune's old object store helper; call ddp_runtime.get(ref) (ray.get) on the "
        "ref ddp_runtime.put returned, or pass large objects with tune.with_parameters(trainable, name=obj)",
        "wait_for_gpu": "a trial's GPU is a Dask worker resource it holds alone until it ends, so there is nothing "
        "to wait for; give GPUs with tune.with_resources(trainable, {'gpu': 1})",
        "diagnose_serialization": "is not built; call cloudpickle.dumps(trainable) in your script to see what "
        "cannot be sent to the Dask workers",
        "deep_update": "is Ray's config plumbing; use sweepflow.tune.utils.merge_dicts(original, new), which returns "
        "the deep merge",
        "UtilMonitor": "is not needed: every trial's MLflow run has system metrics (CPU, memory, GPU) already; read "
        "them in the MLflow UI",
        "warn_if_slow": "is Ray's internal timer; use time.perf_counter() around the code and log the time",
    },
    "sweepflow.air": {
        **{
            name: f"{name} is Ray's resource manager's; give a trial's resources with tune.with_resources(trainable, "
            "{'cpu': 1, 'gpu': 1}) or a TorchTrainer's ScalingConfig"
            for name in ("AcquiredResources", "ResourceRequest")
        },
        "session": "ray.air.session is Ray 2.0-2.6's trainable API; call sweepflow.tune.report(...) and "
        "sweepflow.tune.get_checkpoint() (in a TorchTrainer's function: ddp_runtime.report / get_context)",
        "DatasetConfig": "ray.air.DatasetConfig is Ray 2.0-2.6's; give a TorchTrainer its datasets "
        "(TorchTrainer(datasets={'train': ddp_runtime.data.read_csv(...)})) and ddp_runtime.DataConfig, or give the "
        "trainable its own data loading (large objects through tune.with_parameters)",
    },
    "sweepflow.tune.search.hebo": {"HEBOSearch": _HEBO},
    "sweepflow.tune.integration.pytorch_lightning": {
        name: "Lightning under Tune runs inside a TorchTrainer: use ddp_runtime.lightning.RayTrainReportCallback "
        "in the Trainer and Tuner(TorchTrainer(train_func), param_space={'train_loop_config': {...}})"
        for name in ("TuneReportCallback", "TuneReportCheckpointCallback")
    },
    "sweepflow.tune.integration.keras": {
        name: "sweepflow tunes PyTorch training functions, Keras is not integrated: call sweepflow.tune.report from "
        "your loop"
        for name in ("TuneReportCallback", "TuneReportCheckpointCallback")
    },
    "sweepflow.air.integrations.comet": {
        "CometLoggerCallback": "Comet is not integrated: every trial is an MLflow run; use the MLflow UI and the "
        "sweep report to compare them",
    },
    "sweepflow.tune.experiment": {
        "Experiment": "tune.Experiment specs are not supported; call tune.run(trainable, config=..., ...) or "
        "Tuner(...).fit() once per experiment",
    },
    "sweepflow.tune.logger": {
        **{
            name: f"{name} is Ray's legacy per-trial logger API {_LOGGER}; write your own as a "
            "sweepflow.tune.logger.LoggerCallback"
            for name in ("Logger", "CSVLogger", "JsonLogger", "TBXLogger", "LegacyLoggerCallback", "NoopLogger")
        },
    },
}


class NotBuiltError(ImportError):
    """A Ray Tune name sweepflow does not have; the message says why and what to use."""


def refusing(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that refuses the Ray names listed for ``module`` with their reasons."""
    listed = NOT_BUILT.get(module, {})

    def __getattr__(name: str) -> Any:
        if name in listed:
            ray_module = module.replace("sweepflow.", "ray.", 1)
            raise NotBuiltError(f"{ray_module}.{name}: {listed[name]}", name=name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
