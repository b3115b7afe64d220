"""``sweepflow.tune``: Ray Tune's API on sweepflow — a Ray Tune script runs with ``ray.tune`` imports changed.

    from sweepflow import tune
    from sweepflow.tune.schedulers import ASHAScheduler
    from sweepflow.tune import CLIReporter

Every ``tune.run`` / ``Tuner.fit`` is one Prefect flow run with a task run per trial and one MLflow parent run
with a child run per trial; each trial trains as a DDP group on the Dask cluster.

The names a trainable uses on the workers (``report``, ``checkpoint_dir``, ``get_checkpoint``, the search space
helpers) load without Prefect or MLflow; the rest loads on first use.

Map of the Ray faces (``flows/tune``, ``flows/air``, ``flows/sgd``), in two kinds of files:

* **sweepflow's code behind Ray's API** -- what a script's calls become, lowered to the one experiment
  (``sweepflow.tasks.sweep.experiment``) that the pipeline runs too: ``api`` (``tune.run``, ``Tuner``),
  ``runner`` (the request, its lowering, the ``tune-experiment`` flow), ``trainable`` / ``class_trainable``
  (what a trial runs), ``searchers`` + ``search/optuna``, ``search/concurrency``, ``search/repeater`` (the
  search), ``stopper``, ``callback`` + ``hooks`` (a script's callbacks), ``trial_names``, ``session`` (what a
  trainable calls on a rank), ``shared`` (``with_parameters`` on the workers), ``analysis`` (the results),
  ``reporter`` + ``notebook`` (the trials tables), ``registry`` (``register_best``), ``utils/mock_trainable`` (Ray's examples' test trainable);
  ``air/integrations/mlflow``; ``sgd/plan``, ``sgd/pytorch``, ``sgd/replica``, ``sgd/state`` (Ray SGD's trainer
  on ddp_runtime).
* **Ray's names only** -- a module path or constant a Ray script imports, holding nothing of its own: either it
  re-exports one of the above (``schedulers/__init__``, ``search/__init__``, ``search_space`` helpers,
  ``result``, ``logger``, ``utils``, ``air/__init__``, ``sgd/torch``, ``sgd/integration/torch``) or it refuses
  a name that is not built with the reason and what to use (``not_built`` holds every refusal;
  ``schedulers/pb2``, ``schedulers/hb_bohb``, ``search/{ax,bayesopt,bohb,hyperopt,nevergrad}`` are three-line
  modules pointing at it).
"""

from __future__ import annotations

import importlib
from typing import Any

from ddp_runtime import Checkpoint, CheckpointConfig, FailureConfig
from sweepflow.tune._internal.resources import PlacementGroupFactory
from sweepflow.tune._internal.trainable import function, with_parameters, with_resources
from sweepflow.tune.class_trainable import Trainable
from sweepflow.tune.not_built import refusing
from sweepflow.tune.search_space import (
    choice,
    grid_search,
    loguniform,
    qrandint,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from sweepflow.tune.session import (
    checkpoint_dir,
    get_checkpoint,
    get_context,
    get_trial_dir,
    get_trial_id,
    report,
)

_refuse = refusing(__name__)

_LAZY = {
    "run": "sweepflow.tune.api",
    "Tuner": "sweepflow.tune.api",
    "TuneConfig": "sweepflow.tune.api",
    "RunConfig": "sweepflow.tune.api",
    "CLIReporter": "sweepflow.tune.reporter",
    "JupyterNotebookReporter": "sweepflow.tune.notebook",
    "ExperimentAnalysis": "sweepflow.tune.analysis",
    "ResultGrid": "sweepflow.tune.analysis",
    "Result": "sweepflow.tune.analysis",
    "TuneError": "sweepflow.tune._internal.runner",
    "Stopper": "sweepflow.tune.stopper",
    "Callback": "sweepflow.tune.callback",
    "register_best": "sweepflow.tune.registry",
    "create_scheduler": "sweepflow.tune.schedulers",
    "create_searcher": "sweepflow.tune.search",
    "TuneContext": "sweepflow.tune.session",
}

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Trainable",
    "checkpoint_dir",
    "choice",
    "function",
    "get_checkpoint",
    "get_context",
    "get_trial_dir",
    "get_trial_id",
    "grid_search",
    "loguniform",
    "qrandint",
    "quniform",
    "randint",
    "randn",
    "report",
    "sample_from",
    "uniform",
    "with_parameters",
    "with_resources",
    "PlacementGroupFactory",
    *_LAZY,
]


#: Submodules a script reaches as attributes (``tune.search.ConcurrencyLimiter``, ``tune.schedulers.ASHAScheduler``)
#: without importing them first, as with Ray.
_SUBMODULES = {"search", "schedulers", "stopper", "logger", "analysis", "callback", "result", "utils", "integration"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return _refuse(name)  # a Ray name not built here: an ImportError saying why and what to use
