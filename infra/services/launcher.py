"""A warm launcher for ``sweepflow run``: the flow process starts with Prefect, MLflow and Dask already imported.

Importing the orchestration stack costs ~7 s of CPU here on every run, more than the whole sweep of a small
search. Like the local Prefect server and Dask cluster (``sweepflow.infra.services.local``), one launcher per state dir
stays in the background with those modules imported (the caller's ``preload``), and imports more once it is
idle (``preload_when_idle``: ``sweepflow run``'s is the built-in training module, and so torch, which the
pre-flight of a training function of one's own imports, though the flow runs no torch op; it is not on a cold
run's path). Each ``sweepflow run`` hands it its arguments, environment, working directory and terminal
(stdin/stdout/stderr, passed as file descriptors over a Unix socket), and a *handover*: what the command passes
its child beside the arguments (when it started; ``--set`` values, which may hold credentials), given to the
entry as its second argument and never logged or put on a command line; the launcher forks a child that runs the
command exactly as the CLI would, in a fresh process of its own, and reports the child's exit code back.
The client forwards Ctrl-C/SIGTERM to the child, so a run can be interrupted as usual. Every run is still its own
process and its own recorded Prefect flow run.

The launcher is keyed by what it cannot change after start: the Prefect settings (read when prefect is
imported) and the code itself. If either differs from the client's — another PREFECT_API_URL, or an edited
source file in flows/, tasks/ or ddp_runtime/ — the client restarts it first. ``sweepflow run --no-server``
bypasses it (and every other background service).
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweepflow.infra.services import supervisor as services
from sweepflow.infra.services.compat import run_atexit_handlers

NAME = "launcher"
_MAX_REQUEST = 4 << 20
#: How long the launcher waits for a first run after becoming ready, and for the next one after a run ended,
#: before it imports ``preload_when_idle``: a script's back-to-back runs do not wait for that import.
IDLE_PRELOAD_SECONDS = 30.0
IDLE_AFTER_RUN_SECONDS = 2.0


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, "services", f"{NAME}.sock")


def fingerprint(env: dict[str, str]) -> str:
    """What a running launcher must match: the interpreter, our source files, the Prefect settings."""
    return services.code_fingerprint(extra=[f"{k}={env[k]}" for k in sorted(env) if k.startswith("PREFECT_")])


def launcher_spec(
    state_dir: str,
    env: dict[str, str],
    *,
    entry: str,
    preload: Sequence[str] = (),
    preload_when_idle: Sequence[str] = (),
) -> services.ServiceSpec:
    """``entry`` (``module:function``) is the command line's ``main(argv)`` each child runs; ``preload`` the
    modules the launcher imports once, before it is ready, so that children start with them;
    ``preload_when_idle`` those it imports later, one at a time while no run is going: ``IDLE_AFTER_RUN_SECONDS``
    after a run ended, or ``IDLE_PRELOAD_SECONDS`` after it became ready. All are the caller's: the launcher
    knows nothing of the program it serves."""
    path = socket_path(state_dir)
    ready = os.path.join(state_dir, "services", f"{NAME}.ready")
    key = fingerprint(env)
    argv = [sys.executable, "-m", "sweepflow.infra.services.launcher", "--socket", path, "--ready-file", ready]
    argv += ["--key", key, "--entry", entry, *[f"--preload={module}" for module in preload]]
    argv += [f"--preload-when-idle={module}" for module in preload_when_idle]
    return services.ServiceSpec(
        name=NAME,
        argv=argv,
        health={},
        ready_file=ready,
        health_from_address=lambda address: {"kind": "unix", "path": address, "key": key},
        env={k: v for k, v in env.items() if k.startswith("PREFECT_")},
        code_key=key,
    )


def ensure(
    state_dir: str,
    env: dict[str, str],
    *,
    entry: str,
    preload: Sequence[str] = (),
    preload_when_idle: Sequence[str] = (),
) -> str:
    """A launcher matching ``env`` and the current code; an outdated one is replaced."""
    spec = launcher_spec(state_dir, env, entry=entry, preload=preload, preload_when_idle=preload_when_idle)
    return services.ensure(state_dir, spec)


# --------------------------------------------------------------------------------------------------- client


def run(state_dir: str, argv: list[str], *, handover: Mapping[str, Any]) -> int:
    """Run ``sweepflow <argv>`` in a child of the launcher, on this terminal; return its exit code.
    ``handover`` (JSON values) reaches the child's entry as its second argument: what the command passes on
    beside its arguments (when it started, its ``--set`` values), never logged."""
    request = {"argv": argv, "handover": dict(handover), "env": dict(os.environ), "cwd": os.getcwd()}
    request = json.dumps(request).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(socket_path(state_dir))
        socket.send_fds(conn, [request], [0, 1, 2])
        replies = conn.makefile("r")
        child = int(json.loads(replies.readline())["pid"])

        def forward(signum: int, _frame: Any) -> None:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass  # it has just exited: its exit code is on its way

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            line = replies.readline()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if not line:
        raise RuntimeError(
            f"the sweepflow launcher closed the connection without the run's exit code; see "
            f"{services.log_path(state_dir, NAME)}, or run with --no-server"
        )
    return int(json.loads(line)["exit"])


# --------------------------------------------------------------------------------------------------- server


def _child(request: dict[str, Any], fds: list[int], entry: Callable[[list[str], dict[str, Any]], int]) -> None:
    """In the forked child: take over the client's terminal, environment and directory, run the CLI, exit."""
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import dask

        dask.config.refresh()  # Dask reads DASK_* variables into its config at import
        sys.argv = ["sweepflow", *request["argv"]]
        code = entry([*request["argv"], "--in-process"], request["handover"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - printed on the client's terminal, then the child exits non-zero
        traceback.print_exc()
    finally:
        try:
            run_atexit_handlers()  # what a normal interpreter exit would run (log/event flushes)
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)


def _listen(path: str) -> socket.socket:
    """The launcher's Unix socket at ``path`` (a stale one from a launcher that died is replaced)."""
    if os.path.exists(path):
        os.remove(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)  # only this user may hand the launcher commands
    listener.listen(16)
    return listener


def _wake_on_signals(stopping: list[bool]) -> int:
    """The read end of a pipe that SIGCHLD and SIGTERM write to, so that they wake the selector; SIGTERM also
    appends to ``stopping``."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD/SIGTERM wake the selector serve waits on
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    return wake_r


def _start_run(
    listener: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, socket.socket],
    main: Callable[[list[str], dict[str, Any]], int],
) -> None:
    """Accept a connection and fork a child that runs its request (``_child``), recorded in ``children`` with the
    connection its exit code goes to; a health probe's connection (closed at once) and a bad request are
    dropped."""
    conn, _ = listener.accept()
    try:
        request, fds = _receive(conn)
    except EOFError:  # a health probe: connected and closed
        conn.close()
        return
    except (OSError, ValueError) as exc:
        print(f"rejected a request: {exc}", flush=True)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        selector.close()
        listener.close()
        conn.close()
        _child(request, fds, main)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _reply(conn, {"pid": pid})
    print(f"run {pid}: sweepflow {' '.join(request['argv'])}", flush=True)


def serve(
    path: str,
    ready_file: str,
    *,
    entry: str,
    preload: Sequence[str] = (),
    preload_when_idle: Sequence[str] = (),
    idle_seconds: float = IDLE_PRELOAD_SECONDS,
    idle_after_run: float = IDLE_AFTER_RUN_SECONDS,
) -> None:
    """Foreground body of the launcher service: import the stack once, then fork one child per request.

    ``preload_when_idle`` is imported by this (the main) thread between requests, one module at a time, only
    while no child runs, ``idle_after_run`` seconds after a run ended or ``idle_seconds`` after the launcher
    became ready: a cold start's first run neither waits for those imports nor shares the cores with them, and a
    request that comes in meanwhile waits at most for the module being imported. Forking happens only between
    imports, never during one."""
    module_name, _, function = entry.partition(":")
    main = getattr(importlib.import_module(module_name), function)
    for module in preload:  # e.g. the flow: prefect, mlflow, distributed, pandas and our tasks
        importlib.import_module(module)

    listener = _listen(path)
    stopping: list[bool] = []
    wake_r = _wake_on_signals(stopping)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    with open(ready_file + ".tmp", "w") as f:
        f.write(path)
    os.replace(ready_file + ".tmp", ready_file)
    print(f"launcher ready on {path}", flush=True)
    later = list(preload_when_idle)
    idle_from = time.monotonic() + idle_seconds
    try:
        while not stopping:
            waiting = bool(later) and not children  # something to import, and no run it would slow down
            due = waiting and time.monotonic() >= idle_from
            events = selector.select(timeout=min(5.0, max(0.0, idle_from - time.monotonic())) if waiting else 5.0)
            for key, _ in events:
                if key.fileobj is wake_r:
                    os.read(wake_r, 512)
                    continue
                _start_run(listener, selector, children, main)
            if _reap(children):
                idle_from = time.monotonic() + idle_after_run
            if due and not events and not children:
                _import_when_idle(later.pop(0))
    finally:
        listener.close()
        if os.path.exists(path):
            os.remove(path)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
    if not data and not fds:
        raise EOFError
    while not data.endswith(b"\n") and len(data) < _MAX_REQUEST:
        more = conn.recv(_MAX_REQUEST)
        if not more:
            break
        data += more
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected stdin/stdout/stderr descriptors, got {len(fds)}")
    return json.loads(data), list(fds)


def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError as exc:  # the client went away (e.g. killed): the run itself is unaffected
        print(f"could not reply {message} to a client: {exc}", flush=True)


def _import_when_idle(module: str) -> None:
    started = time.monotonic()
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the launcher stays up; each run imports it and says what is wrong
        print(f"could not import {module} ahead of the runs: {type(exc).__name__}: {exc}", flush=True)
        return
    print(f"imported {module} while idle in {time.monotonic() - started:.1f}s", flush=True)


def _reap(children: dict[int, socket.socket]) -> int:
    """Reply to the clients of the children that have ended; how many did."""
    ended = 0
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        conn = children.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(status)
            _reply(conn, {"exit": code if code >= 0 else 128 - code})
            conn.close()
            print(f"run {pid}: exit {code}", flush=True)
            ended += 1
    return ended


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the warm launcher behind `sweepflow run` (foreground)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--key", required=True, help="the fingerprint this launcher was started for")
    parser.add_argument("--entry", required=True, help="module:function, the CLI's main(argv)")
    parser.add_argument("--preload", action="append", default=[], help="a module to import once, up front")
    parser.add_argument(
        "--preload-when-idle", action="append", default=[], help="a module to import once no run is going"
    )
    args = parser.parse_args()
    serve(
        args.socket, args.ready_file, entry=args.entry, preload=args.preload, preload_when_idle=args.preload_when_idle
    )
