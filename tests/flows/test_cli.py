"""`sweepflow run` as a user runs it: background Prefect, MLflow and Dask services started once, then reused."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

SWEEPFLOW = os.path.join(os.path.dirname(sys.executable), "sweepflow")
SMALL = [
    "sweep.num_samples=2",
    "training.epochs=2",
    "scheduler.type=fifo",
    "resources.ranks_per_trial=1",
]


def _run(state_dir: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [SWEEPFLOW, "run", "--summary-json", os.path.join(state_dir, "summary.json")]
    for item in [*SMALL, f"state_dir={state_dir}", *extra]:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.prefect
@pytest.mark.mlflow_server
@pytest.mark.dask
@pytest.mark.subprocess
def test_cli_runs_the_pipeline_reuses_its_local_services_and_ctrl_c_stops_a_run_not_the_launcher(tmp_path):
    """Three `sweepflow run`s on one state dir: the first starts the background services; the second is
    interrupted with Ctrl-C while its trials run in a child of the warm launcher (flow run Crashed, exit 130);
    the third (an adaptive sampler) reuses every service, the launcher included."""
    state = str(tmp_path / "state")
    try:
        first = _run(state)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert "Leaderboard (best first):" in first.stdout
        records = {}
        for name in ("prefect", "mlflow", "dask", "launcher"):
            with open(os.path.join(state, "services", f"{name}.json")) as f:
                records[name] = json.load(f)
        # The MLflow UI is already serving: the links go straight to its runs table (model-training view).
        assert f"runs table:       {records['mlflow']['address']}/#/experiments/" in first.stdout
        # The flow run's own log (what a deployment's user sees in the Prefect UI) links them too.
        logged = first.stdout + first.stderr
        assert "compare the trials in the MLflow UI:" in logged
        assert f"registered model: {records['mlflow']['address']}/#/models/" in logged
        assert f"Prefect flow run: {records['prefect']['address'].removesuffix('/api')}/runs/flow-run/" in logged

        _interrupt_a_run(state)

        second = _run(
            state, "sweep.sampler=tpe"
        )  # adaptive: each trial's config proposed from results so far
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "(tpe sampler)" in second.stdout + second.stderr
        for name, record in records.items():
            with open(os.path.join(state, "services", f"{name}.json")) as f:
                assert json.load(f) == record, f"{name} was restarted instead of reused"
        with open(os.path.join(state, "summary.json")) as f:
            summary = json.load(f)
        assert summary["registration"]["version"] == 2  # the interrupted run registered nothing
        status = subprocess.run(
            [SWEEPFLOW, "server", "status", "--state-dir", state], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout
        assert all(record["address"] in status.stdout for record in records.values())
    finally:
        subprocess.run([SWEEPFLOW, "server", "stop", "--state-dir", state], capture_output=True, text=True)
    status = subprocess.run(
        [SWEEPFLOW, "server", "status", "--state-dir", state], capture_output=True, text=True
    )
    assert status.returncode == 1


def _interrupt_a_run(state: str) -> None:
    """`sweepflow run` hands the flow to a child of the warm launcher; Ctrl-C on the command must still stop
    the run: flow run marked Crashed, exit 130."""
    cmd = [SWEEPFLOW, "run"]
    for item in [*SMALL, "sweep.num_samples=6", "training.epochs=3", f"state_dir={state}"]:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, restore_signals=True
    )
    try:
        lines = []
        for line in proc.stdout:  # wait until trials are running inside the launcher's child
            lines.append(line)
            if "running," in line:
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output[-3000:]
    assert "Crashed" in output, output[-3000:]


def test_launcher_fingerprint_follows_prefect_settings_and_code():
    from sweepflow.infra.services.launcher import fingerprint

    base = {"PREFECT_API_URL": "http://127.0.0.1:1/api", "HOME": "/x"}
    assert fingerprint(base) == fingerprint({**base, "HOME": "/y"})  # other variables don't matter
    assert fingerprint(base) != fingerprint({**base, "PREFECT_API_URL": "http://127.0.0.1:2/api"})


def test_cli_rejects_an_invalid_config_before_any_work(tmp_path):
    proc = subprocess.run(
        [SWEEPFLOW, "run", "--set", "resources.gpus_per_rank=0.5", "--set", f"state_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "ranks_per_trial" in proc.stderr and "invalid configuration" in proc.stderr
    assert not os.path.exists(tmp_path / "services")


def test_cli_rejects_a_malformed_config_file_with_one_message_and_no_traceback(tmp_path):
    bad = tmp_path / "sweep.yaml"
    bad.write_text("sweep:\n  num_samples: [4\n")
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- 1\n- 2\n")
    for path, expected in ((bad, "is not valid YAML"), (not_a_mapping, "must hold a mapping")):
        proc = subprocess.run(
            [SWEEPFLOW, "run", "--config", str(path), "--set", f"state_dir={tmp_path}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert expected in proc.stderr and str(path) in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not os.path.exists(tmp_path / "services")


def test_cli_refuses_an_unreachable_tracking_server_in_seconds_without_leaking_its_credentials(tmp_path):
    import socket
    import time

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = subprocess.run(
        [
            SWEEPFLOW,
            "run",
            "--set",
            f"mlflow.tracking_uri=http://alice:s3cr3t@127.0.0.1:{port}",
            "--set",
            f"state_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started < 90  # MLflow's own client would retry for minutes
    assert f"http://***@127.0.0.1:{port}" in proc.stderr and "did not answer" in proc.stderr
    assert "s3cr3t" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "services")


def _temporary_server_env(tmp_path, **extra: str) -> dict[str, str]:
    """A `--no-server` run's environment with no Prefect API configured (Prefect's temporary server), the
    server's database under tmp_path instead of ~/.prefect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_EPHEMERAL_ENABLED="true",  # whatever the user's Prefect profile says
        SWEEPFLOW_HOME=str(tmp_path / "home"),
        **extra,
    )
    return env


def _prefect_template_in(env: dict[str, str]) -> str:
    """The Prefect database template (sweepflow.infra.services.sqlite_templates) in env's XDG_CACHE_HOME: a copy of
    this machine's when there is one (any local server made it), else made there by the code that makes it.
    Returns its path."""
    from sweepflow.infra.services import sqlite_templates
    from sweepflow.infra.services.prefect_server import prefect_template_version

    version = prefect_template_version()
    mine = sqlite_templates.template_path("prefect", version)
    theirs = os.path.join(env["XDG_CACHE_HOME"], "sweepflow", os.path.basename(mine))
    if os.path.exists(mine):
        os.makedirs(os.path.dirname(theirs))
        sqlite_templates.copy_database(mine, theirs)
        return theirs
    script = "from sweepflow.infra.services.prefect_server import prefect_seed; print(prefect_seed())"
    home = os.path.join(env["XDG_CACHE_HOME"], "prefect-home")
    made = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env={**env, "PREFECT_HOME": home}
    )
    assert made.stdout.strip() == "migrated", made.stdout + made.stderr[-3000:]
    return theirs


def _running_with_prefect_home(prefect_home: str) -> list[int]:
    import psutil

    return [
        p.pid
        for p in psutil.process_iter(["environ"])
        if (p.info["environ"] or {}).get("PREFECT_HOME") == prefect_home
    ]


@pytest.mark.prefect
@pytest.mark.subprocess
def test_no_server_gives_up_on_prefects_temporary_server_at_its_bound_in_one_sentence(tmp_path):
    """A bound no start-up can meet (1 s: the server's imports alone take longer): exit 2 with what happened and
    what to do in one line, no traceback, and the half-started server stopped, not left behind."""
    env = _temporary_server_env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    proc = subprocess.run(
        [SWEEPFLOW, "run", "--no-server", "--set", f"state_dir={tmp_path / 'state'}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("sweepflow: Prefect's temporary server (--no-server) did not answer within 1 s"), line
    assert "run without --no-server" in line and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=" in line
    assert not _running_with_prefect_home(env["PREFECT_HOME"])


def test_the_temporary_servers_bound_is_whole_seconds_of_at_least_one():
    from sweepflow.flows.run_services import TEMPORARY_SERVER_TIMEOUT_S, temporary_server_timeout
    from sweepflow.flows.settings import Settings

    name = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    assert temporary_server_timeout(Settings.from_env({})) == TEMPORARY_SERVER_TIMEOUT_S == 120
    assert temporary_server_timeout(Settings.from_env({name: "300"})) == 300
    for bad in ("0", "-5", "1.5", "soon"):
        with pytest.raises(ValueError, match=f"{name}='{bad}' is not a whole number of seconds"):
            temporary_server_timeout(Settings.from_env({name: bad}))


@pytest.mark.prefect
@pytest.mark.subprocess
def test_no_servers_temporary_server_sends_no_telemetry(tmp_path):
    """Offline (as here), Prefect's server logs an ERROR about its telemetry as it starts ("Failed to send
    telemetry", or the telemetry task's own failure). `--no-server`'s temporary server runs with it off: its
    settings say so, and nothing about telemetry is printed in the seconds after its start, when the telemetry
    task runs first. The flow's client uses that server (the one started for it, not a second). Its new database
    is a copy of the template a local server makes (sweepflow.infra.services.sqlite_templates), block types included:
    it starts with registration off and lists them."""
    script = "\n".join(
        [
            "import time, httpx",
            "from prefect.client.orchestration import get_client",
            "from prefect.server.api.server import SubprocessASGIServer",
            "from sweepflow.flows.settings import Settings",
            "from sweepflow.flows.run_services import use_temporary_prefect",
            "use_temporary_prefect(Settings.from_env())",
            "server = SubprocessASGIServer()",
            "with get_client(sync_client=True) as client:",
            "    assert str(client.api_url).rstrip('/') == server.api_url, (client.api_url, server.api_url)",
            "settings = httpx.get(server.api_url + '/admin/settings', timeout=30).json()",
            "started = time.monotonic()",
            "print('analytics enabled:', settings['server']['analytics_enabled'], flush=True)",
            "print('registers blocks:', settings['server']['register_blocks_on_start'], flush=True)",
            "listed = httpx.post(server.api_url + '/block_types/filter', json={}, timeout=30).json()",
            "print('block types:', sorted(b['slug'] for b in listed), flush=True)",
            # The template holds exactly what a server's start-up registers: on a copy of it, the start-up's
            # registration (Prefect's own function, collections loaded first, as its start-up does) adds nothing.
            "import asyncio, sqlite3, sys, prefect.plugins",
            "from prefect.server.database import provide_database_interface",
            "from prefect.server.models.block_registration import run_block_auto_registration",
            "from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings",
            "def rows():",
            "    with sqlite3.connect(sys.argv[1]) as db:",
            "        return [db.execute(f'SELECT COUNT(*) FROM {t}').fetchone()[0] for t in ('block_type', 'block_schema')]",
            "before = rows()",
            "prefect.plugins.load_prefect_collections()",
            "async def start_up():",
            "    async with await provide_database_interface().session() as session:",
            "        await run_block_auto_registration(session=session)",
            "with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f'sqlite+aiosqlite:///{sys.argv[1]}'}):",
            "    asyncio.run(start_up())",
            "print('template rows:', before, 'after a start-up registration:', rows(), flush=True)",
            "time.sleep(max(0.0, 8 - (time.monotonic() - started)))",
        ]
    )
    env = _temporary_server_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"))
    template = _prefect_template_in(env)
    check = str(tmp_path / "registration-check.db")
    shutil.copyfile(template, check)
    assert "PREFECT_SERVER_ANALYTICS_ENABLED" not in env  # the setting is sweepflow's, not the test's
    proc = subprocess.run(
        [sys.executable, "-c", script, check], capture_output=True, text=True, timeout=300, env=env
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "analytics enabled: False" in proc.stdout, output[-3000:]
    rows = next(line for line in proc.stdout.splitlines() if line.startswith("template rows:"))
    before, after = (json.loads(part) for part in re.findall(r"\[[0-9, ]+\]", rows))
    assert before == after and before[0] >= 40, rows
    assert "registers blocks: False" in proc.stdout, output[-3000:]
    listed = next(line for line in proc.stdout.splitlines() if line.startswith("block types:"))
    assert all(f"'{slug}'" in listed for slug in ("secret", "local-file-system", "webhook")), listed
    assert "telemetry" not in output.lower(), output[-3000:]
    assert not _running_with_prefect_home(env["PREFECT_HOME"])  # stopped when the process exited
