"""The sweepflow command: run the training pipeline, start a project of your own, manage the services.

sweepflow run [--config FILE.yaml] [--set key=value ...] [--no-server] [--resume PARENT_RUN_ID]
sweepflow init DIR                                  (a working project of your own to start from)
sweepflow server start|stop|status                  (the background services `sweepflow run` starts and reuses)
sweepflow stack up|down|status|env|logs [SERVICE]   (the full stack on this machine: see infra/services/stack.py)
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.credentials import Credentials
    from sweepflow.flows.settings import Settings


def _config_problem(exc: BaseException) -> str:
    """What is wrong with a config, on one line: each of pydantic's errors as ``field: reason``."""
    from pydantic import ValidationError

    from sweepflow.flows.config_file import config_problem

    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(config_problem(error) for error in exc.errors())


def _state_dir(config, settings) -> str:
    from sweepflow.flows.settings import resolve_settings

    return resolve_settings(config, settings).state_dir


def _module_file(train_fn: str, project_dir: str | None = None) -> str | None:
    """The source file of a ``module:function`` training function that the warm Dask workers import once and
    keep. None for one in the project's directory: the ranks import it from there for each trial and forget it
    after (``project_importable``), so an edit needs no restart; and a process whose current directory is the
    project (the launcher's run) must key the cluster as one that cannot import it (the command) does."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(train_fn.partition(":")[0])
    except ImportError:
        return None  # reported with the fix when the flow checks the training function
    if spec is None or not spec.has_location or not spec.origin:
        return None
    if project_dir and os.path.abspath(spec.origin).startswith(os.path.join(os.path.abspath(project_dir), "")):
        return None
    return spec.origin


def launcher_preload() -> tuple[list[str], list[str]]:
    """What the warm launcher imports once, so that each run's process starts with it (on the default sweep's warm
    path: 2.3 s of CPU per run for the first two, 2.6 s for the last two): before it is ready, the flow, and the
    sweep report and the fANOVA importances it draws (Optuna, scikit-learn, SciPy); once it is idle, the
    built-in training function's module, and with it torch. The flow runs no torch op and checks the built-in
    function without it (``sweepflow.tasks.training.hparams``), but the pre-flight imports a training function of
    one's own, which imports torch, in each run: a cold start's first run does not wait for that import (2.5
    CPU-s on the two cores the services start on), later runs find it done. Only our own modules: a user's
    training module is imported by each run, so an edit to it is always seen (the launcher restarts when our
    code changes)."""
    from sweepflow.flows.config import DEFAULT_TRAIN_FN

    now = ["sweepflow.flows.pipeline", "sweepflow.tasks.reporting.sweep_report", "optuna.importance"]
    return now, [DEFAULT_TRAIN_FN.partition(":")[0]]


def _use_local_services(config, settings, state_dir: str, *, launcher: bool):
    """Point this run at its services (``sweepflow.flows.run_services``: what is not configured is the state
    dir's background service), and (``launcher``) the warm launcher."""
    from sweepflow.flows.run_services import use_run_services
    from sweepflow.infra.services import launcher as warm_launcher

    extra = {}
    if launcher:  # reads the environment once the Prefect settings are in it
        now, when_idle = launcher_preload()
        extra["launcher"] = lambda: warm_launcher.ensure(
            state_dir, dict(os.environ), entry=f"{__name__}:main", preload=now, preload_when_idle=when_idle
        )
    chosen = use_run_services(
        settings,
        state_dir,
        tracking_uri=config.mlflow.tracking_uri,
        scheduler_address=config.dask.scheduler_address,
        use_gpu=config.resources.use_gpu,
        n_workers=config.dask.n_workers,
        code_files=[path for path in [_module_file(config.training.train_fn, config.project_dir)] if path],
        extra=extra,
    )
    update = {}
    if "mlflow" in chosen.started:
        update["mlflow"] = config.mlflow.model_copy(update={"tracking_uri": chosen.tracking_uri})
    if "dask" in chosen.started:
        update["dask"] = config.dask.model_copy(update={"scheduler_address": chosen.scheduler_address})
    return config.model_copy(update=update)


def _refuse(exc: BaseException, args: argparse.Namespace) -> int:
    """A mistake in the user's input: one sentence and exit 2 (the traceback only with --debug)."""
    if getattr(args, "debug", False):
        import traceback

        traceback.print_exception(exc)
    print(f"sweepflow: {exc}", file=sys.stderr)
    return 2


def _service_failed(exc: BaseException, args: argparse.Namespace) -> int:
    """A service the run needs failed it (the tracking server's error, or its outage past the retry bound): its
    sentence and exit 1 (the traceback only with --debug; the flow's log has it too)."""
    if getattr(args, "debug", False):
        import traceback

        traceback.print_exception(exc)
    print(f"sweepflow: {exc}", file=sys.stderr)
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    # A run handed to the warm launcher by the front process (below) gets, beside its arguments, when *that
    # command* started (wall-clock: its timings count from there) and its --set values.
    t0 = float(args.handover.get("started_at") or time.time())
    overrides = [*args.handover.get("sets", ()), *args.set]
    checked = _checked_run(args, overrides)
    if isinstance(checked, int):  # refused, and said
        return checked
    config, settings, credentials = checked
    state_dir = _state_dir(config, settings)
    if not args.no_server:
        config = _use_local_services(config, settings, state_dir, launcher=not args.in_process)
        if not args.in_process:
            return _hand_to_launcher(args, state_dir, overrides, started_at=t0)
    else:
        from sweepflow.flows.run_services import TemporaryServerError, use_temporary_prefect

        try:  # Prefect's temporary server, waited for within our bound (not at the flow's first call)
            use_temporary_prefect(settings)
        except (TemporaryServerError, ValueError) as exc:
            return _refuse(exc, args)
    t_server = time.time()
    ran = _run_flow(args, config, settings, credentials, sets=len(overrides))
    if isinstance(ran, int):  # the flow failed, and said how
        return ran
    summary, t_import = ran
    t_end = time.time()
    from sweepflow.flows.cli_output import print_run

    print_run(summary, args, timings=(t0, t_server, t_import, t_end))
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, default=str, indent=2)
    return 0


def _checked_run(
    args: argparse.Namespace, overrides: list[str]
) -> tuple[PipelineConfig, Settings, Credentials] | int:
    """``sweepflow run``'s config (``overrides``: its ``--set`` values) and settings, all of it checked before
    any service, run or trial starts: (the config without its credentials, the settings, the credentials); or
    the exit status of a refusal, said already."""
    try:
        from sweepflow.flows.config_file import load_config_file

        config = load_config_file(args.config, overrides)
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError: field + reason
        return _refuse(ValueError(f"invalid configuration: {_config_problem(exc)}"), args)
    from sweepflow.flows.credentials import split_credentials
    from sweepflow.flows.preflight import PreflightError, check_pipeline
    from sweepflow.flows.settings import Settings, resolve_settings

    try:  # the one read of the environment's settings; passed down from here
        settings = Settings.from_env()
    except ValueError as exc:
        return _refuse(exc, args)
    try:  # the config becomes the flow run's parameters, which Prefect stores: credentials leave it here
        public, credentials = split_credentials(config, settings)
    except ValueError as exc:
        return _refuse(exc, args)
    # Everything checkable is checked now, before any service, run or trial starts. The thin front process
    # that hands the run to the warm launcher leaves the training code's import to that process (torch is
    # loaded there once the launcher has been idle), which checks everything again before it starts the flow.
    front = not args.no_server and not args.in_process
    try:
        check_pipeline(
            resolve_settings(config, settings),
            prefect_api_url=settings.prefect_api_url,
            imports=not front,
            resume_from=args.resume,
        )
    except PreflightError as exc:
        return _refuse(exc, args)
    return public, settings, credentials


def _hand_to_launcher(
    args: argparse.Namespace, state_dir: str, overrides: list[str], *, started_at: float
) -> int:
    """The same command, run in a warm child of the launcher; its exit status."""
    from sweepflow.infra.services import launcher

    # The launcher logs the commands it runs and --set values may hold credentials, so they travel in the
    # handover it gives the child's main() (never logged), not in its arguments.
    argv, skip = [], False
    for token in args.argv:
        if not skip and token != "--set" and not token.startswith("--set="):
            argv.append(token)
        skip = token == "--set" and not skip
    return launcher.run(state_dir, argv, handover={"started_at": started_at, "sets": overrides})


def _run_flow(
    args: argparse.Namespace,
    config: PipelineConfig,
    settings: Settings,
    credentials: Credentials,
    *,
    sets: int,
) -> tuple[dict[str, Any], float] | int:
    """The training pipeline's flow, run in this process with the command's settings and credentials: its
    summary and when its imports were done (for the timings); or, when it failed, the exit status, said already
    (``sets``: how many --set values the command that finishes it needs again)."""
    from sweepflow.flows.experiment import AfterSweepFailed
    from sweepflow.flows.pipeline import (  # imports prefect: after PREFECT_API_URL is set
        EvaluationMismatch,
        bound_training_pipeline,
    )
    from sweepflow.flows.run_console import console_tracebacks, finish_command
    from sweepflow.tasks.sweep.trial import MetricNotReported
    from sweepflow.tasks.tracking.runs import TrackingServerError, TrackingServerUnavailable

    t_import = time.time()
    credentials.install()  # MLflow's auth variables, for the flow, in this process only
    training_pipeline = bound_training_pipeline(settings, credentials)
    try:
        with console_tracebacks(shown=args.debug):
            summary = training_pipeline(config=config, resume_from=args.resume)
    except MetricNotReported as exc:  # found at the first report: the sweep stopped at once
        return _refuse(exc, args)
    except (TrackingServerError, TrackingServerUnavailable) as exc:  # said at once, not the user's mistake
        return _service_failed(exc, args)
    except AfterSweepFailed as exc:  # the sweep is recorded: its sentence ends with the command that finishes it
        said = RuntimeError(exc.finish(finish_command(args, exc.parent_run_id, sets=sets)))
        said.__cause__ = exc
        # A setting to change (the champion metric) is the user's mistake, exit 2; a function that failed, 1.
        return _refuse(said, args) if isinstance(exc, EvaluationMismatch) else _service_failed(said, args)
    return summary, t_import


def cmd_init(args: argparse.Namespace) -> int:
    from sweepflow.flows.init_project import init_lines

    try:
        print("\n".join(init_lines(args.directory, template=args.template)))
    except (FileExistsError, OSError, ValueError) as exc:
        return _refuse(exc, args)
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.settings import Settings
    from sweepflow.infra.services import supervisor
    from sweepflow.infra.services.local import (
        IDLE_STOP,
        LOCAL_SERVICES,
        ensure_dask,
        ensure_mlflow,
        ensure_server,
        stop_server,
        use_idle_stop,
    )
    from sweepflow.tasks import WORKER_PRELOAD

    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"sweepflow server: {exc}", file=sys.stderr)
        return 2
    state_dir = _state_dir(PipelineConfig(state_dir=args.state_dir), settings)
    if args.action == "start":  # each one reused if alive and healthy, (re)started otherwise; in parallel
        starts = {
            "prefect": ensure_server,
            "mlflow": ensure_mlflow,
            "dask": lambda state_dir: ensure_dask(state_dir, worker_preload=[WORKER_PRELOAD]),
        }
        idle_stop = use_idle_stop(state_dir, settings.services_idle_minutes * 60)
        if idle_stop:  # they stop themselves once unused for that long (sweepflow.infra.services.idle)
            starts[IDLE_STOP] = lambda _: idle_stop()
        with ThreadPoolExecutor(max_workers=len(starts)) as pool:
            futures = {name: pool.submit(start, state_dir) for name, start in starts.items()}
            failed = False
            for name, future in futures.items():
                try:
                    print(f"{name}: {future.result()}")
                except RuntimeError as exc:  # says which service, its command and the end of its log
                    print(f"sweepflow server: {exc}", file=sys.stderr)
                    failed = True
        if failed:
            print(f"stop what did start with: sweepflow server stop --state-dir {state_dir}", file=sys.stderr)
        return 1 if failed else 0
    if args.action == "stop":
        try:
            print("stopped" if stop_server(state_dir) else "no server recorded")
        except RuntimeError as exc:
            print(f"sweepflow server: {exc}", file=sys.stderr)
            return 1
        return 0
    states = {  # the idle watchdog only where there is one (not with SWEEPFLOW_SERVICES_IDLE_MINUTES=0)
        name: supervisor.describe(state_dir, name)
        for name in LOCAL_SERVICES
        if name != IDLE_STOP or supervisor.read_record(state_dir, name)
    }
    for name, (address, why) in states.items():
        print(f"{name}: {address or why}")
    return 0 if all(address for address, _ in states.values()) else 1


def cmd_stack(args: argparse.Namespace) -> int:
    from sweepflow.flows import cli_stack
    from sweepflow.flows.settings import Settings
    from sweepflow.infra.services import stack

    settings = Settings.from_env()
    state_dir = os.path.abspath(args.state_dir or stack.default_state_dir(settings.home, settings.stack_dir))
    if args.action == "up":
        return cli_stack.up(args, settings, state_dir)
    if args.action == "down":
        return cli_stack.down(state_dir)
    if args.action == "env":
        return cli_stack.env(state_dir)
    if args.action == "logs":
        print(stack.logs(state_dir, args.service) or f"no stack logs under {state_dir}")
        return 0
    return cli_stack.status(state_dir)


def build_parser() -> argparse.ArgumentParser:
    """The ``sweepflow`` command's parser: every command, its help and options (docs/hooks.py renders the CLI
    reference from it)."""
    parser = argparse.ArgumentParser(
        prog="sweepflow", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub)
    _add_init_command(sub)
    _add_server_command(sub)
    _add_stack_command(sub)
    return parser


def _add_run_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sweepflow run`` and its options."""
    run = sub.add_parser("run", help="run the training pipeline")
    run.add_argument("--config", help="YAML file with PipelineConfig fields")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. sweep.num_samples=4"
    )
    run.add_argument(
        "--no-server",
        action="store_true",
        help="don't start or reuse the background services: this run gets Prefect's temporary server, the SQLite "
        "MLflow store under the state dir and a Dask cluster of its own; the server and the cluster stop when it "
        "ends (Prefect's server gets PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS to start, default 120)",
    )
    run.add_argument("--summary-json", help="write the run summary to this file")
    run.add_argument(
        "--resume",
        metavar="PARENT_RUN_ID",
        help="continue an interrupted run (its MLflow parent run id, printed as 'MLflow parent run ...') with the same "
        "settings: ended trials are kept, running ones continue from their checkpoints",
    )
    run.add_argument(
        "--in-process",
        action="store_true",
        help="run the flow in this process instead of a child of the warm launcher (see infra/services/launcher.py)",
    )
    run.add_argument("--debug", action="store_true", help="show the traceback behind a refused configuration")
    run.set_defaults(func=cmd_run)


def _add_init_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sweepflow init`` and its options."""
    init = sub.add_parser(
        "init", help="write a small working project of your own (data, train/model/evaluate functions, sweep.yaml)"
    )
    init.add_argument("directory", help="a new (or empty) directory")
    init.add_argument(
        "--template",
        choices=("pytorch", "lightning", "transformers"),
        default="pytorch",
        help="the training loop of its train_fn: plain PyTorch (default), a Lightning Trainer "
        "(sweepflow[lightning]) or a Hugging Face Trainer (sweepflow[transformers])",
    )
    init.set_defaults(func=cmd_init)


def _add_server_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sweepflow server`` and its options."""
    server = sub.add_parser(
        "server",
        help="start, stop or show the background services `sweepflow run` starts and reuses: Prefect server, "
        "MLflow server, Dask cluster, warm launcher, idle watchdog",
        description="The background services `sweepflow run` starts the first time and reuses (on free 127.0.0.1 "
        "ports; they stop themselves after $SWEEPFLOW_SERVICES_IDLE_MINUTES unused, default 60). start: the "
        "Prefect server, MLflow server and Dask cluster (and the idle watchdog), reused when healthy; stop: every "
        "one of them, the launcher included; status: each one's address, or why it is down (exit 1 if any is).",
    )
    server.add_argument(
        "action", choices=["start", "stop", "status"], help="start | stop | status (see above)"
    )
    server.add_argument("--state-dir", default=None, help="default: $SWEEPFLOW_HOME (~/.sweepflow)")
    server.set_defaults(func=cmd_server)


def _add_stack_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sweepflow stack`` and its options; those that expose the services beyond this machine in a group of
    their own (``_add_stack_exposure``)."""
    stack = sub.add_parser(
        "stack",
        help="the full stack on this machine: S3 gateway, MLflow server, Prefect server + worker, Dask",
        description="The whole stack a deployment runs on, on this machine (infra/stack runs this after installing "
        "the stack extra). up: start what is not running (and restart what is DOWN); down: stop every process of "
        "every service; status: each service's address or why it is DOWN; env: print stack.env, the clients' "
        "settings; logs [SERVICE]: the end of the services' logs.",
    )
    stack.add_argument(
        "action", choices=["up", "down", "status", "env", "logs"], help="up | down | status | env | logs"
    )
    stack.add_argument("service", nargs="?", default=None, help="for logs: one service (default: all)")
    stack.add_argument(
        "--state-dir", default=None, help="default: $SWEEPFLOW_HOME/stack (~/.sweepflow/stack)"
    )
    stack.add_argument("--workers", type=int, default=2, help="Dask workers on a host without GPUs")
    stack.add_argument(
        "--database-url-file",
        metavar="FILE",
        help="up: file holding a PostgreSQL server URL, postgresql://USER:PASSWORD@HOST:PORT/, for the Prefect "
        "server's and MLflow's databases (sweepflow_prefect, sweepflow_mlflow: created if missing); default "
        "$SWEEPFLOW_STACK_DATABASE_URL, else SQLite files in the state dir",
    )
    _add_stack_exposure(stack)
    stack.set_defaults(func=cmd_stack)


def _add_stack_exposure(stack: argparse.ArgumentParser) -> None:
    """``sweepflow stack up``'s options that expose the services (docs/exposing.md): the address they bind,
    Prefect's and MLflow's auth, Dask's TLS."""
    expose = stack.add_argument_group("exposing the services (up; see docs/exposing.md)")
    expose.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the services bind and advertise (default 127.0.0.1: this machine only); "
        "health checks and dashboards stay on 127.0.0.1",
    )
    expose.add_argument(
        "--prefect-auth-file",
        metavar="FILE",
        help="file holding USER:PASSWORD: Prefect server's PREFECT_SERVER_API_AUTH_STRING, and "
        "PREFECT_API_AUTH_STRING in stack.env for its clients",
    )
    expose.add_argument(
        "--mlflow-auth-file",
        metavar="FILE",
        help="file holding USER:PASSWORD: MLflow's basic-auth app with this admin, and "
        "MLFLOW_TRACKING_USERNAME/PASSWORD in stack.env",
    )
    expose.add_argument("--mlflow-allowed-hosts", metavar="HOSTS", help="mlflow server --allowed-hosts")
    expose.add_argument("--tls-ca-file", metavar="PEM", help="Dask TLS: CA certificate(s)")
    expose.add_argument("--tls-cert", metavar="PEM", help="Dask TLS: certificate (services and clients)")
    expose.add_argument("--tls-key", metavar="PEM", help="Dask TLS: its private key")
    expose.add_argument(
        "--insecure",
        action="store_true",
        help="allow a --host other than 127.0.0.1 without Prefect/MLflow auth and Dask TLS (trusted networks only)",
    )


def main(argv: list[str] | None = None, handover: dict[str, Any] | None = None) -> int:
    """The ``sweepflow`` command. ``handover``: what the warm launcher's client passed its child beside the
    arguments (``sweepflow run``'s start time and ``--set`` values; ``launcher.run``)."""
    if argv is None:  # this process is the command (not a caller in its own process): it exits after this
        # The interpreter's teardown let the garbage collector walk the imported stack (prefect, mlflow,
        # matplotlib) again and again: 1.8 s of every command's exit, 0.1 s with the collector frozen once every
        # other exit handler has run (registered first, it runs last). ddp_runtime/_exit.py does the same for the
        # Dask workers; this line repeats it because importing ddp_runtime here would import distributed (~1 s
        # for every command, `sweepflow server status` included).
        atexit.register(gc.freeze)
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.handover = dict(handover or {})
    # Before MLflow is imported here or in a service started from here: it starts its telemetry at import.
    from sweepflow.infra.services.local import MLFLOW_SETTINGS

    os.environ.update(MLFLOW_SETTINGS)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
