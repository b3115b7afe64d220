"""Checks that run before any work: each answers in seconds and fails with one ``PreflightError`` sentence.

A sweep costs hours of GPU time, so whatever can be known to fail is found here, before any MLflow run,
Prefect task run, download or Dask group: the training function (imports, is callable, takes 0 or 1
arguments, accepts the configs it will get, reports the metrics the sweep needs), the registered model name,
and whether the services named in the configuration answer (bounded waits, never a client's minutes of
retries). The pipeline's own composition of these checks is ``sweepflow.flows.preflight``.

Every message names the field, the value (credentials removed) and the fix. This module imports no Prefect,
MLflow, Dask or torch (a lint contract): the CLI uses it before anything heavy is loaded, and its checks are
tested without those. The two that need Dask's client or MLflow's own rules are in ``library_checks``.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sweepflow.tasks.datasets.uris import join, redact

#: How long a service gets to answer a reachability check.
REACH_TIMEOUT_S = 5.0


class PreflightError(ValueError):
    """A setting that cannot work, found before any work started. ``str()`` is the whole message."""

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field, self.problem, self.fix = field, problem, fix
        shown = redact(value) if isinstance(value, str) else value
        super().__init__(f"{field}={shown!r}: {problem}; {fix}")


# ------------------------------------------------------------------------------------------- training function


#: The training frameworks sweepflow's extras bring (``sweepflow init --template``), by top-level module.
FRAMEWORK_EXTRAS = {
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "transformers": "transformers",
    "accelerate": "transformers",
    "tokenizers": "transformers",
}


def load_train_fn(
    target: str | Callable[..., Any], *, field: str = "training.train_fn", arity: bool = True
) -> Callable[..., Any]:
    """The training function ``target`` names (``module:function``), imported here, checked to be a function
    of 0 or 1 arguments (a function object is only checked)."""
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").partition(".")[0]
            extra = FRAMEWORK_EXTRAS.get(top)
            raise PreflightError(
                field,
                target,
                f"no module named {exc.name!r}",
                f"install sweepflow's {extra} extra here and on every Dask worker: pip install 'sweepflow[{extra}]'"
                if extra
                else "install the package that holds it here and on every Dask worker, or put it on PYTHONPATH",
            ) from None
        except Exception as exc:  # noqa: BLE001 - any error in the module's own code (SyntaxError, ...) is reported
            raise PreflightError(
                field,
                target,
                f"importing {module_name!r} failed with {type(exc).__name__}: {exc}",
                "fix that module (run `python -c 'import " + module_name + "'` to see the traceback)",
            ) from None
        if not hasattr(module, attr):
            public = sorted(
                n
                for n, v in vars(module).items()
                if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
            )
            raise PreflightError(
                field,
                target,
                f"module {module_name!r} has no attribute {attr!r}",
                f"use one of {public[:12]}",
            )
        fn = getattr(module, attr)
    else:
        fn = target
    if not callable(fn):
        raise PreflightError(
            field,
            target if isinstance(target, str) else repr(fn),
            f"is a {type(fn).__name__}, not a function",
            "name a function that takes the trial's config dict (or no arguments)",
        )
    if arity:
        _check_arity(fn, target if isinstance(target, str) else repr(fn), field)
    return fn


def load_project_fn(target: str, *, field: str, arguments: tuple[str, ...]) -> Callable[..., Any]:
    """A project function (``data.prepare_fn``, ``training.model_fn``, ``evaluation.evaluate_fn``) imported here
    and checked to take exactly ``arguments`` positionally (the pipeline calls it so)."""
    fn = load_train_fn(target, field=field, arity=False)
    try:
        inspect.signature(fn).bind(*arguments)
    except TypeError as exc:
        wanted = ", ".join(arguments)
        raise PreflightError(
            field,
            target,
            f"cannot be called as {target.partition(':')[2]}({wanted}): {exc}",
            f"give it the signature `def {target.partition(':')[2]}({wanted}):`",
        ) from None
    except ValueError:  # no signature to read (a builtin): called as it is
        pass
    return fn


def _check_arity(fn: Callable[..., Any], shown: str, field: str) -> None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a signature: called with the config
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    required_kw = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty]
    if len(required) > 1 or required_kw:
        names = [p.name for p in required + required_kw]
        raise PreflightError(
            field,
            shown,
            f"takes {len(names)} required arguments {names}, but a training function is called with one (the "
            "trial's config dict) or none",
            "give it the signature `def train_fn(config):` and read the other values from config",
        )


def validate_train_configs(
    fn: Callable[..., Any], configs: Iterable[Mapping[str, Any]], *, field: str = "training.base_config"
) -> None:
    """Run the training function's own ``validate(config)`` (its optional ``validate`` attribute, see
    ``sweepflow.tasks.training.function.with_checks``) on every config the sweep will give it."""
    validate = getattr(fn, "validate", None)
    if validate is None:
        return
    for config in configs:
        try:
            validate(dict(config))
        except (ValueError, TypeError, KeyError) as exc:
            shown = {k: v for k, v in config.items() if k != "data_path"}
            raise PreflightError(
                field,
                shown,
                f"the training function rejects this trial config: {exc}",
                "change training.base_config / training.model, or the search space values it samples",
            ) from None


def check_reported_metrics(fn: Callable[..., Any], wanted: Mapping[str, str | None]) -> None:
    """``wanted`` maps a field (``selection.metric``) to the metric it names; each must be among the metrics
    the training function declares it reports (its optional ``reports`` attribute). Undeclared functions are
    checked at their first report instead (``sweepflow.tasks.sweep.trial.MetricNotReported``)."""
    reports = getattr(fn, "reports", None)
    if reports is None:
        return
    for field, metric in wanted.items():
        if metric and metric not in reports and metric != "training_iteration":  # the sweep counts reports
            raise PreflightError(
                field,
                metric,
                f"the training function never reports it (it reports {sorted(reports)})",
                f"set {field} to one of those",
            )


# ------------------------------------------------------------------------------------------------ MLflow stores


#: Tracking URI schemes MLflow 3 has stores for (a path without a scheme is a file store).
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks")


def check_tracking_uri_scheme(uri: str, *, field: str = "mlflow.tracking_uri") -> None:
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme and scheme not in TRACKING_SCHEMES:
        raise PreflightError(
            field,
            uri,
            f"MLflow has no tracking store for scheme {scheme!r}",
            f"use one of {', '.join(s + '://' for s in TRACKING_SCHEMES)}, or leave it unset for the local store",
        )


# ---------------------------------------------------------------------------------------------- reachability


def http_problem(url: str, *, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why ``url`` (credentials stripped before the request) does not answer 2xx within ``timeout_s``, or None."""
    parts = urlsplit(url)
    bare = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()
    try:
        with urllib.request.urlopen(bare, timeout=timeout_s) as response:
            return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


class ServiceUnreachable(PreflightError, ConnectionError):
    """A service named in the configuration did not answer within the check's bound."""


def _check_health(url: str, *, field: str, value: str, what: str, fix: str, timeout_s: float) -> None:
    problem = http_problem(url.rstrip("/") + "/health", timeout_s=timeout_s)
    if problem:
        raise ServiceUnreachable(
            field, value, f"{what} did not answer its health check within {timeout_s:g} s ({problem})", fix
        )


def check_tracking_server(
    tracking_uri: str, *, field: str = "mlflow.tracking_uri", timeout_s: float = REACH_TIMEOUT_S
) -> None:
    """An HTTP(S) tracking server must answer its health check within ``timeout_s`` (MLflow's own client would
    retry for minutes). Other stores (sqlite:, file:, databricks) are not checked here."""
    if tracking_uri.startswith(("http://", "https://")):
        _check_health(
            tracking_uri,
            field=field,
            value=tracking_uri,
            what="the MLflow tracking server",
            fix="check mlflow.tracking_uri / MLFLOW_TRACKING_URI, that the server is running, and that this "
            "machine can reach it",
            timeout_s=timeout_s,
        )


def check_prefect_api(
    api_url: str, *, field: str = "PREFECT_API_URL", timeout_s: float = REACH_TIMEOUT_S
) -> None:
    _check_health(
        api_url,
        field=field,
        value=api_url,
        what="the Prefect API",
        fix="start the server (`prefect server start`, or `sweepflow server start`), fix PREFECT_API_URL, or "
        "unset it to let `sweepflow run` start a local server",
        timeout_s=timeout_s,
    )


def unimportable(targets: Iterable[str], import_dir: str | None) -> list[str]:
    """Run on a Dask worker: each ``module:function`` of ``targets`` that does not import there (with
    ``import_dir``, a project's directory, on the import path as for a trial), as ``target: Type: message``."""
    from sweepflow.tasks.training.function import project_importable

    problems = []
    with project_importable(import_dir):
        for target in targets:
            module_name, _, attr = target.partition(":")
            try:
                getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError, SyntaxError) as exc:
                problems.append(f"{target}: {type(exc).__name__}: {exc}")
    return problems


def check_worker_imports(
    client: Any,
    targets: Mapping[str, str],
    import_dir: str | None,
    *,
    timeout_s: float = 120,
    fix: str = "install your package on the workers (pip install your project there), or give project_dir a path "
    "the workers share",
) -> None:
    """One worker of ``client``'s cluster imports every function of ``targets`` (config key -> ``module:function``)
    the trials and the evaluation will run there: a package installed only where the flow runs fails here, before
    any download or trial, not in every rank of every trial."""
    workers = list(client.scheduler_info(n_workers=-1).get("workers", {}))
    if not workers or not targets:
        return
    future = client.submit(unimportable, list(targets.values()), import_dir, workers=workers[:1], pure=False)
    problems = future.result(timeout=timeout_s)
    if problems:
        keys = [key for key, target in targets.items() if any(p.startswith(f"{target}:") for p in problems)]
        raise PreflightError(
            keys[0],
            targets[keys[0]],
            f"does not import on the Dask worker {workers[0]} ({'; '.join(problems)})",
            fix,
        )


def check_s3(
    uri: str,
    *,
    field: str,
    storage_options: Mapping[str, Any] | None = None,
    timeout_s: float = REACH_TIMEOUT_S,
) -> None:
    """The bucket of an ``s3://bucket/...`` location exists and answers within ``timeout_s`` (connections are
    tried twice at most, instead of botocore's and s3fs's minutes of retries)."""
    import s3fs

    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    options = dict(storage_options or {})
    config = {"connect_timeout": timeout_s, "read_timeout": timeout_s, "retries": {"max_attempts": 2}}
    options["config_kwargs"] = {**config, **options.get("config_kwargs", {})}
    endpoint = (options.get("client_kwargs") or {}).get("endpoint_url") or options.get("endpoint_url")
    endpoint = (
        endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
    )

    def probe() -> bool:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        return fs.exists(bucket)

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        exists = pool.submit(probe).result(timeout=3 * timeout_s)
    except concurrent.futures.TimeoutError:
        problem = f"the S3 endpoint {endpoint} did not answer within {3 * timeout_s:g} s"
    except (OSError, ValueError, PermissionError) as exc:
        problem = f"the S3 endpoint {endpoint} failed: {type(exc).__name__}: {redact(str(exc))}"
    else:
        if exists:
            return
        problem = f"bucket {bucket!r} does not exist at {endpoint} (or these credentials cannot see it)"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    raise ServiceUnreachable(
        field,
        uri,
        problem,
        "check AWS_ENDPOINT_URL_S3 / the storage options' endpoint_url, the credentials (AWS_ACCESS_KEY_ID, ...), "
        "and that the bucket exists",
    )


def check_http_source(base: str, filename: str, *, field: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """An HTTP(S) mirror ``base`` answers for its first file ``filename`` within ``timeout_s``."""
    import requests  # MLflow's dependency; sends the URL's user:password as basic auth

    try:
        response = requests.head(join(base, filename), timeout=timeout_s, allow_redirects=True)
    except requests.RequestException as exc:
        raise ServiceUnreachable(
            field,
            base,
            f"the host did not answer within {timeout_s:g} s ({type(exc).__name__})",
            "check the address, that the server runs, and that this machine (and the Dask workers) can reach it",
        ) from None
    if response.status_code in (401, 403):
        raise PreflightError(
            field, base, f"access denied (HTTP {response.status_code})", "check the credentials"
        )
    if response.status_code == 404 or response.status_code >= 500:
        raise PreflightError(
            field,
            base,
            f"HTTP {response.status_code} for {filename!r}",
            "point it at the location that holds the dataset's files (with their official names)",
        )


def check_writable_dir(path: str, *, field: str) -> None:
    """A local directory that exists or can be made, and can be written."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".sweepflow-write-check-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise PreflightError(
            field, path, f"cannot write there ({exc.strerror or exc})", "choose a directory you can write"
        ) from None


# ------------------------------------------------------------------------------------------------ resources


def check_local_resources(
    *,
    ranks_per_trial: int,
    n_workers: int,
    gpus_per_rank: float,
    gpus: int,
    cpus_per_rank: float | None,
    cpus_per_worker: float,
) -> None:
    """A trial fits the local cluster the run will start (``n_workers`` workers, ``gpus`` GPUs on this host)."""
    if gpus_per_rank and not gpus:
        raise PreflightError(
            "resources.gpus_per_rank",
            gpus_per_rank,
            "this machine has no GPU (nvidia-smi lists none) and no Dask scheduler is configured",
            "set resources.gpus_per_rank=0 to train on CPUs, or point dask.scheduler_address at a cluster with GPU "
            "workers",
        )
    workers = gpus if gpus_per_rank else n_workers
    if ranks_per_trial > workers:
        raise PreflightError(
            "resources.ranks_per_trial",
            ranks_per_trial,
            f"the local cluster has {workers} worker(s) ({'one per GPU' if gpus_per_rank else 'dask.n_workers'}), "
            "so no trial could ever start",
            f"use at most {workers} ranks per trial, or raise dask.n_workers / use a larger cluster",
        )
    if cpus_per_rank and cpus_per_rank > cpus_per_worker:
        raise PreflightError(
            "resources.cpus_per_rank",
            cpus_per_rank,
            f"each local worker has {cpus_per_worker:g} core(s)",
            f"ask for at most {cpus_per_worker:g}, or lower dask.n_workers so each worker gets more cores",
        )
