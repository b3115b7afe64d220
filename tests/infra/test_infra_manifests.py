"""Static checks of the deployment files under infra/ (Dockerfile, docker-compose.yml, Kubernetes manifests).

They cannot run here (no Docker engine, no Kubernetes, no GPU), so these tests parse them and check what a
deployment depends on, deriving the expectations from the code where it has them: the environment variables
flows/settings.py reads, the work pool prefect.yaml deploys to, the Dask preload module ddp_runtime uses, the
packages and console scripts pyproject.toml installs. `docker compose config` and `kubectl kustomize` run too
when those tools are installed.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.machinery
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys

import paths

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (the dev extra)
    import tomli as tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = paths.ROOT
INFRA = ROOT / "infra"
COMPOSE_FILE = INFRA / "docker-compose.yml"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
K8S = INFRA / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
SECRET_EXAMPLE = K8S / "secret.example.yaml"
HELM_VALUES = K8S / "prefect-worker-values.yaml"
PREFECT_YAML = ROOT / "prefect.yaml"

DEFAULT_WORK_POOL = "sweepflow-process"  # used only while prefect.yaml does not exist
# The services the stack needs; the Dask GPU workers are found by their command (`dask worker ...`).
REQUIRED_SERVICES = {
    "postgres",
    "minio",
    "minio-buckets",
    "mlflow",
    "prefect-server",
    "prefect-worker",
    "dask-scheduler",
}
# Services that run our code, so must run the image built from infra/docker/Dockerfile.
SWEEPFLOW_IMAGE_SERVICES = {"mlflow", "prefect-worker", "dask-scheduler"}


# ---------------------------------------------------------------------------------------------------------
# What the code says
# ---------------------------------------------------------------------------------------------------------


def settings_env() -> tuple[str, ...]:
    """The environment variables sweepflow reads for machine-dependent settings, plus the S3 endpoint."""
    from sweepflow.flows.settings import SETTINGS_ENV

    return (*SETTINGS_ENV, "AWS_ENDPOINT_URL_S3")


def expected_work_pool() -> str:
    """The work pool prefect.yaml's deployments use (all must use the same one), else the default name."""
    if not PREFECT_YAML.exists():
        return DEFAULT_WORK_POOL
    deployments = (yaml.safe_load(PREFECT_YAML.read_text()) or {}).get("deployments") or []
    pools = {(d.get("work_pool") or {}).get("name") for d in deployments}
    assert len(pools) == 1 and None not in pools, (
        f"prefect.yaml: every deployment needs the same work_pool.name (found {pools}); the workers in infra/ "
        "poll a single pool"
    )
    return pools.pop()


def dask_preload_module() -> str:
    """ddp_runtime.cluster.PRELOAD, read from the source (importing ddp_runtime imports torch: slow)."""
    tree = ast.parse((ROOT / "ddp_runtime" / "cluster.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PRELOAD" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("ddp_runtime/cluster.py no longer defines PRELOAD: update this test")


def module_exists(dotted: str) -> bool:
    """importlib.util.find_spec, without running the parent packages' __init__ (ddp_runtime's imports torch)."""
    head, *rest = dotted.split(".")
    spec = importlib.util.find_spec(head)
    for part in rest:
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, spec.submodule_search_locations)
    return spec is not None


@functools.cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def artifacts_destination_for(env: dict[str, str]) -> str | None:
    """Where flows/settings.py says MLflow's proxied artifacts live, given a deployment's environment."""
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.settings import resolve_settings

    mlflow = resolve_settings(PipelineConfig(), env=env).mlflow
    return getattr(mlflow, "artifacts_destination", None)


# ---------------------------------------------------------------------------------------------------------
# Small parsing helpers
# ---------------------------------------------------------------------------------------------------------


def interpolate(value: Any) -> str:
    """A compose value with its ${VAR:-default} / ${VAR} substituted by the defaults (what runs with no .env)."""
    pattern = r"\$\$|\$\{(\w+)(?::?[-?]([^}]*))?\}"  # `$$` is compose's escaped `$`
    return re.sub(pattern, lambda m: "$" if m.group(0) == "$$" else m.group(2) or "", str(value))


def option_value(argv: list[str], option: str) -> str | None:
    """The value of `--opt value` or `--opt=value` in an argument list (None when absent)."""
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def host_allowed(host: str, allowed_hosts: str) -> bool:
    """MLflow's Host-header check (mlflow.server.security_utils.is_allowed_host_header)."""
    patterns = [p.strip() for p in allowed_hosts.split(",")]
    return "*" in patterns or any(fnmatch.fnmatch(host, p) if "*" in p else host == p for p in patterns)


def s3_bucket(uri: str) -> str:
    parsed = urlparse(uri)
    assert parsed.scheme == "s3", f"expected an s3:// URI, got {uri!r}"
    return parsed.netloc


# ---------------------------------------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(v) for k, v in env.items()}


def dask_workers() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if argv(s)[:2] == ["dask", "worker"]}


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = service.get("depends_on") or {}
    return {d: {} for d in deps} if isinstance(deps, list) else deps


def test_compose_has_the_required_services():
    missing = REQUIRED_SERVICES - services().keys()
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"
    assert dask_workers(), "docker-compose.yml has no Dask worker service (command `dask worker ...`)"


def test_our_services_build_the_sweepflow_image_from_the_dockerfile():
    images = set()
    for name in sorted(SWEEPFLOW_IMAGE_SERVICES | dask_workers().keys()):
        service = services()[name]
        build = service.get("build")
        assert isinstance(build, dict), (
            f"service {name}: needs `build:` (context + dockerfile), got {build!r}"
        )
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context == ROOT, f"service {name}: build context must be the repo root, got {context}"
        dockerfile = (context / build.get("dockerfile", "Dockerfile")).resolve()
        assert dockerfile == DOCKERFILE, f"service {name}: builds {dockerfile}, expected {DOCKERFILE}"
        images.add(interpolate(service.get("image")))
    assert len(images) == 1, f"our services should share one image name (built once), got {sorted(images)}"


def test_dependencies_wait_for_health_or_completion():
    for name, service in services().items():
        for dep, spec in depends_on(service).items():
            assert dep in services(), f"service {name} depends on unknown service {dep!r}"
            condition = spec.get("condition")
            target = services()[dep]
            if "healthcheck" in target:
                expected = "service_healthy"
            elif target.get("restart") == "no":  # a one-shot job
                expected = "service_completed_successfully"
            else:
                pytest.fail(f"service {name} depends on {dep}, which has no healthcheck: add one to {dep}")
            assert condition == expected, (
                f"service {name}: depends_on {dep} should use `condition: {expected}`, got {condition!r}"
            )


def test_commands_connecting_to_a_service_start_after_it():
    def reachable(name: str) -> set[str]:
        seen, todo = set(), [name]
        while todo:
            for dep in depends_on(services()[todo.pop()]):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    for name, service in services().items():
        command = " ".join(interpolate(a) for a in argv(service))
        for other in services():
            if other != name and re.search(rf"(//|@){re.escape(other)}:", command):
                assert other in reachable(name), (
                    f"service {name}'s command connects to {other}: add it to {name}'s depends_on"
                )


def test_published_ports_bind_loopback_only():
    for name, service in services().items():
        for port in service.get("ports") or []:
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", (
                f"service {name} publishes {port!r} on all interfaces: write it as '127.0.0.1:HOST:CONTAINER'"
            )


def test_dask_gpu_workers_own_one_gpu_each_and_advertise_it():
    preload = dask_preload_module()
    assert module_exists(preload), f"the Dask preload module {preload} is not importable"
    device_ids, names = [], []
    for name, service in dask_workers().items():
        args = argv(service)
        assert option_value(args, "--resources") == "GPU=1", (
            f"{name}: pass `--resources GPU=1` (ScalingConfig)"
        )
        assert option_value(args, "--preload") == preload, f"{name}: pass `--preload {preload}`"
        assert option_value(args, "--nthreads") == "1", f"{name}: one rank per worker process: `--nthreads 1`"
        assert option_value(args, "--nworkers") in (None, "1"), f"{name}: one worker process per GPU"
        names.append(option_value(args, "--name"))
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices") or []
        gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])]
        assert len(gpus) == 1, f"{name}: reserve a GPU (deploy.resources.reservations.devices, driver nvidia)"
        assert len(gpus[0].get("device_ids") or []) == 1 and "count" not in gpus[0], (
            f'{name}: pin exactly one GPU with `device_ids: ["<i>"]`; `count: 1` gives every container the '
            "same first GPU (docker/compose#11863), and DDP needs a distinct GPU per rank"
        )
        assert service.get("deploy", {}).get("replicas", 1) == 1, (
            f"{name}: replicas would share one GPU; add a service per GPU instead"
        )
        device_ids += gpus[0]["device_ids"]
        assert service.get("shm_size"), f"{name}: set shm_size (NCCL and DataLoader workers use /dev/shm)"
    assert len(set(device_ids)) == len(device_ids), f"two Dask workers share a GPU: device_ids {device_ids}"
    assert None not in names and len(set(names)) == len(names), f"Dask worker --name must be unique: {names}"


def test_dask_workers_can_run_ranks():
    for name, service in dask_workers().items():
        env = environment(service)
        assert env.get("DASK_DISTRIBUTED__WORKER__DAEMON", "").lower() == "false", (
            f"{name}: set DASK_DISTRIBUTED__WORKER__DAEMON=False (DataLoader workers need non-daemonic processes)"
        )
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env.get(var), f"{name}: ranks write checkpoints to S3 and need {var}"


def test_dask_options_exist_in_the_installed_distributed():
    from distributed.cli.dask_scheduler import main as scheduler_cli
    from distributed.cli.dask_worker import main as worker_cli

    known = {
        "worker": {opt for param in worker_cli.params for opt in param.opts},
        "scheduler": {opt for param in scheduler_cli.params for opt in param.opts},
    }
    for name, service in services().items():
        args = argv(service)
        if args[:1] == ["dask"]:
            used = {a.split("=")[0] for a in args if a.startswith("--")}
            assert used <= known[args[1]], (
                f"{name}: `dask {args[1]}` has no option {sorted(used - known[args[1]])}"
            )


def test_prefect_worker_gets_the_settings_and_polls_the_deployments_pool():
    service = services()["prefect-worker"]
    env = environment(service)
    missing = [var for var in settings_env() if not env.get(var)]
    assert not missing, f"prefect-worker: set {missing} (read by flows/settings.py) in its environment"
    args = argv(service)
    assert args[:3] == ["prefect", "worker", "start"], f"prefect-worker runs {args}"
    pool = expected_work_pool()
    assert option_value(args, "--pool") == pool, (
        f"prefect-worker must poll {pool!r} (prefect.yaml's work pool)"
    )


def test_prefect_worker_addresses_point_at_the_services():
    env = environment(services()["prefect-worker"])
    targets = {
        "MLFLOW_TRACKING_URI": ("mlflow", "--port"),
        "DASK_SCHEDULER_ADDRESS": ("dask-scheduler", "--port"),
        "PREFECT_API_URL": ("prefect-server", "--port"),
    }
    for var, (service, port_option) in targets.items():
        url = urlparse(env[var])
        port = option_value(argv(services()[service]), port_option)
        assert (url.hostname, str(url.port)) == (service, port), (
            f"prefect-worker: {var}={env[var]} should point at service {service} port {port}"
        )


def test_mlflow_serves_artifacts_from_the_storage_the_code_expects():
    service = services()["mlflow"]
    args = [interpolate(a) for a in argv(service)]
    assert args[:2] == ["mlflow", "server"], f"mlflow runs {args}"
    assert "--serve-artifacts" in args, "mlflow: pass --serve-artifacts (clients go through the server)"
    destination = option_value(args, "--artifacts-destination") or ""
    assert destination.startswith("s3://"), (
        f"mlflow: --artifacts-destination must be s3://..., got {destination}"
    )
    assert (option_value(args, "--backend-store-uri") or "").startswith("postgresql"), (
        "mlflow: --backend-store-uri should be the postgres service (postgresql+psycopg2://...)"
    )
    expected = artifacts_destination_for(environment(services()["prefect-worker"]))
    if expected is not None:
        assert destination == expected, (
            f"mlflow --artifacts-destination {destination} != {expected}, where flows/settings.py makes the ranks "
            "write checkpoints ($SWEEPFLOW_STORAGE/mlflow): make them agree"
        )
    tracking = urlparse(environment(services()["prefect-worker"])["MLFLOW_TRACKING_URI"]).netloc
    assert host_allowed(tracking, option_value(args, "--allowed-hosts") or "localhost"), (
        f"mlflow: add {tracking} to --allowed-hosts, or MLflow answers 403 to the clients"
    )


def test_databases_and_credentials_match_postgres_and_minio():
    postgres = environment(services()["postgres"])
    init_sql = "\n".join(
        (COMPOSE_FILE.parent / volume.split(":")[0]).read_text()
        for volume in services()["postgres"].get("volumes") or []
        if "docker-entrypoint-initdb.d" in volume
    )
    databases = {postgres["POSTGRES_DB"], *re.findall(r"CREATE DATABASE\s+(\w+)", init_sql, re.IGNORECASE)}
    urls = {
        "mlflow --backend-store-uri": option_value(
            [interpolate(a) for a in argv(services()["mlflow"])], "--backend-store-uri"
        ),
        "prefect-server database URL": environment(services()["prefect-server"])[
            "PREFECT_API_DATABASE_CONNECTION_URL"
        ],
    }
    for what, url in urls.items():
        parsed = urlparse(url)
        assert parsed.hostname == "postgres", (
            f"{what}: host should be the postgres service, got {parsed.hostname}"
        )
        assert (parsed.username, parsed.password) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
        ), f"{what}: use ${{POSTGRES_USER}}/${{POSTGRES_PASSWORD}} (same defaults as the postgres service)"
        assert parsed.path.lstrip("/") in databases, (
            f"{what}: database {parsed.path} is never created ({databases})"
        )
    minio = environment(services()["minio"])
    for name in ("mlflow", "prefect-worker", *dask_workers()):
        env = environment(services()[name])
        assert (env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")) == (
            minio["MINIO_ROOT_USER"],
            minio["MINIO_ROOT_PASSWORD"],
        ), f"{name}: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY should be MinIO's credentials"


def test_buckets_the_stack_uses_are_created():
    command = " ".join(argv(services()["minio-buckets"]))
    created = set(re.findall(r"mc mb\b[^&;]*?\blocal/([\w.-]+)", command))
    storage = environment(services()["prefect-worker"])["SWEEPFLOW_STORAGE"]
    destination = option_value(
        [interpolate(a) for a in argv(services()["mlflow"])], "--artifacts-destination"
    )
    for uri in (storage, destination):
        assert s3_bucket(uri) in created, (
            f"minio-buckets does not create the bucket of {uri} (creates {created})"
        )


# ---------------------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = current.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
            current = ""
    return instructions


def instruction_args(keyword: str) -> list[str]:
    return [args for kw, args in dockerfile() if kw == keyword]


def dockerfile_uid() -> int:
    users = instruction_args("USER")
    assert users, "Dockerfile: add `USER <uid>:<gid>` (a non-root user) after the installs"
    user = users[-1].split(":")[0]
    assert user.isdigit(), f"Dockerfile: USER {user!r} should be numeric (Kubernetes runAsNonRoot checks it)"
    return int(user)


def test_dockerfile_base_image_matches_requires_python():
    from packaging.specifiers import SpecifierSet

    base = instruction_args("FROM")[0]
    match = re.fullmatch(r"python:(3\.\d+)[\w.-]*", base)
    assert match, f"Dockerfile: FROM should be an official python:3.x image, got {base!r}"
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert f"{match.group(1)}.0" in requires, (
        f"Dockerfile: {base} does not satisfy requires-python {requires}"
    )


def test_dockerfile_installs_the_project_and_its_requirements():
    runs = " ".join(instruction_args("RUN"))
    assert re.search(r"pip install(\s+--?[\w-]+(=\S+)?)*\s+\.(\s|$)", runs), (
        "Dockerfile: `pip install .` missing"
    )
    # What the servers need comes from pyproject.toml's extras (tests/infra/services/test_server_images.py), not from here.
    assert "requirements.py pyproject.toml" in runs and "pip install -r /tmp/requirements.txt" in runs
    assert any(a.startswith("TORCH_INDEX_URL") for a in instruction_args("ARG")), (
        "Dockerfile: ARG TORCH_INDEX_URL"
    )
    assert instruction_args("WORKDIR")[-1] == "/opt/sweepflow", "Dockerfile: WORKDIR /opt/sweepflow"


def test_dockerfile_copies_every_package_and_the_deployments():
    copied = set()
    for args in instruction_args("COPY"):
        sources = [a for a in shlex.split(args) if not a.startswith("--")][:-1]
        for source in sources:
            if not any(c in source for c in "*?["):
                assert (ROOT / source).exists(), f"Dockerfile: COPY {source}: no such path in the repo"
            copied.add(source.rstrip("/"))
    setuptools = pyproject()["tool"]["setuptools"]
    roots = setuptools["package-dir"]  # one line per import root: a subpackage is under its root's folder

    def folder(package: str) -> str:
        root = max((r for r in roots if package == r or package.startswith(r + ".")), key=len, default="")
        rest = package[len(root) :].lstrip(".").replace(".", "/")
        return "/".join(p for p in (roots.get(root, ""), rest) if p)

    modules = {
        str(path.relative_to(ROOT)) for package in setuptools["packages"] for path in (ROOT / folder(package)).glob("*.py")
    }
    assert "infra/__init__.py" in modules and "flows/tune/schedulers/__init__.py" in modules  # the packages were found
    missing = {m for m in modules if not any(m == c or m.startswith(c + "/") for c in copied)}
    assert not missing, f"Dockerfile: COPY the modules of the packages pyproject installs: {sorted(missing)}"
    if PREFECT_YAML.exists():
        assert any(fnmatch.fnmatch("prefect.yaml", c) for c in copied), "Dockerfile: COPY prefect.yaml"
        for deployment in yaml.safe_load(PREFECT_YAML.read_text()).get("deployments") or []:
            top = deployment["entrypoint"].split("/")[0]
            assert top in {Path(c).parts[0] for c in copied}, (
                f"Dockerfile: the deployment entrypoint {deployment['entrypoint']} is not copied"
            )


def test_dockerfile_runs_as_non_root_without_entrypoint():
    assert dockerfile_uid() != 0, "Dockerfile: the final USER must not be root"
    assert not instruction_args("ENTRYPOINT"), (
        "Dockerfile: no ENTRYPOINT: compose `command:` and Kubernetes `args:` give the whole command line"
    )


def test_programs_run_in_our_image_are_installed_with_the_project():
    scripts = pyproject()["project"]["scripts"]
    bin_dir = Path(sys.executable).parent  # the venv has the same dependencies as the image
    commands = [argv(services()[name]) for name in SWEEPFLOW_IMAGE_SERVICES | dask_workers().keys()]
    commands += [c.get("command") or c["args"] for c in k8s_containers()]
    for cmd in instruction_args("CMD"):
        commands.append(yaml.safe_load(cmd) if cmd.startswith("[") else shlex.split(cmd))
    for program, *_ in commands:
        if program == "sweepflow":
            assert program in scripts, "`sweepflow` is run but is not in pyproject's [project.scripts]"
        else:
            assert (bin_dir / program).exists(), f"`{program}` is not installed by the project's dependencies"


# ---------------------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def kustomization() -> dict[str, Any]:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p not in (KUSTOMIZATION, HELM_VALUES))


@functools.cache
def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in manifest_files() for d in yaml.safe_load_all(p.read_text()) if d]


def k8s_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d["kind"] == kind]


def namespace() -> str:
    return kustomization()["namespace"]


def configmap() -> dict[str, Any]:
    (cm,) = [d for d in k8s_kind("ConfigMap") if d["metadata"]["name"] == "sweepflow-settings"]
    return cm


def pod_specs() -> list[dict[str, Any]]:
    specs = [d["spec"]["template"]["spec"] for d in k8s_kind("Deployment")]
    for cluster in k8s_kind("DaskCluster"):
        specs += [cluster["spec"]["scheduler"]["spec"], cluster["spec"]["worker"]["spec"]]
    return specs


def k8s_containers() -> list[dict[str, Any]]:
    return [c for spec in pod_specs() for c in spec["containers"]]


def dask_cluster() -> dict[str, Any]:
    (cluster,) = k8s_kind("DaskCluster")
    return cluster


def container_env(container: dict[str, Any]) -> dict[str, str | None]:
    """The container's environment as far as the manifests tell (None: from a Secret)."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            env.update(configmap()["data"])
        elif "secretRef" in source:
            env.update(dict.fromkeys(secret_keys()[source["secretRef"]["name"]]))
    for var in container.get("env") or []:
        ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
        env[var["name"]] = configmap()["data"].get(ref["key"]) if ref else var.get("value")
    return env


def expand(arg: str, env: dict[str, str | None]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1))), arg)


@functools.cache
def secret_keys() -> dict[str, set[str]]:
    docs = [d for d in yaml.safe_load_all(SECRET_EXAMPLE.read_text()) if d]
    return {d["metadata"]["name"]: set(d.get("stringData") or d.get("data") or {}) for d in docs}


def test_every_manifest_document_is_well_formed():
    for name, doc in k8s_docs():
        for field in ("apiVersion", "kind"):
            assert doc.get(field), f"{name}: a document has no {field}"
        assert (doc.get("metadata") or {}).get("name"), f"{name}: a {doc['kind']} has no metadata.name"


def test_everything_is_in_one_namespace():
    (ns,) = k8s_kind("Namespace")
    assert ns["metadata"]["name"] == namespace(), (
        "namespace.yaml and kustomization.yaml disagree on the namespace"
    )
    for name, doc in k8s_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == namespace(), (
                f"{name}: {doc['kind']} {doc['metadata']['name']} should be in namespace {namespace()}"
            )


def test_kustomization_lists_existing_manifests_but_not_the_example_secret():
    resources = kustomization()["resources"]
    for resource in resources:
        assert (K8S / resource).exists(), f"kustomization.yaml lists {resource}, which does not exist"
    assert SECRET_EXAMPLE.name not in resources, "kustomization.yaml must not apply the example secret"
    unlisted = {p.name for p in manifest_files()} - set(resources) - {SECRET_EXAMPLE.name}
    assert not unlisted, f"kustomization.yaml does not list {sorted(unlisted)}"


def test_every_container_runs_the_image_kustomize_rewrites():
    names = {image["name"] for image in kustomization().get("images") or []}
    for container in k8s_containers():
        assert container["image"] in names, (
            f"container {container['name']} runs {container['image']!r}: use the sweepflow image name from "
            f"kustomization.yaml's `images` ({sorted(names)}) so one edit sets registry and tag everywhere"
        )


def test_pods_run_as_the_image_user():
    uid = dockerfile_uid()
    for spec in pod_specs():
        context = spec.get("securityContext") or {}
        assert context.get("runAsNonRoot") is True and context.get("runAsUser") == uid, (
            f"pod of {[c['name'] for c in spec['containers']]}: set securityContext runAsNonRoot: true, "
            f"runAsUser: {uid} (the Dockerfile's USER)"
        )


def test_dask_cluster_follows_the_operator_schema_and_owns_gpus():
    cluster = dask_cluster()
    spec = cluster["spec"]
    assert {"spec", "service"} <= spec["scheduler"].keys(), (
        "DaskCluster: scheduler needs `spec` and `service`"
    )
    assert isinstance(spec["worker"].get("replicas"), int) and "spec" in spec["worker"], (
        "DaskCluster: worker needs `replicas` (an integer) and `spec` (a PodSpec)"
    )
    worker = spec["worker"]["spec"]["containers"][0]
    gpus = str(worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu"))
    assert gpus == "1", f"DaskCluster worker: resources.limits nvidia.com/gpu should be 1, got {gpus}"
    args = worker["args"]
    assert option_value(args, "--resources") == "GPU=1", "DaskCluster worker: args need `--resources GPU=1`"
    assert option_value(args, "--preload") == dask_preload_module(), (
        f"DaskCluster worker: args need `--preload {dask_preload_module()}`"
    )
    assert option_value(args, "--nthreads") == "1", (
        "DaskCluster worker: `--nthreads 1` (one rank per process)"
    )
    assert option_value(args, "--name") == "$(DASK_WORKER_NAME)", (
        "DaskCluster worker: --name $(DASK_WORKER_NAME)"
    )
    env = container_env(worker)
    assert str(env.get("DASK_DISTRIBUTED__WORKER__DAEMON")).lower() == "false", (
        "DaskCluster worker: set env DASK_DISTRIBUTED__WORKER__DAEMON=False (DataLoader workers need it)"
    )


def test_dask_scheduler_service_selects_the_scheduler_pod_by_named_ports():
    cluster = dask_cluster()
    scheduler = cluster["spec"]["scheduler"]
    selector = scheduler["service"]["selector"]
    pod_labels = {"dask.org/cluster-name": cluster["metadata"]["name"], "dask.org/component": "scheduler"}
    assert selector == pod_labels, (
        f"DaskCluster service selector should be {pod_labels} (the operator's labels)"
    )
    container_ports = {p["name"]: p["containerPort"] for p in scheduler["spec"]["containers"][0]["ports"]}
    service_ports = {p["name"]: p for p in scheduler["service"]["ports"]}
    for name in ("tcp-comm", "http-dashboard"):  # the operator looks the ports up by these names
        assert name in service_ports and service_ports[name]["targetPort"] in container_ports, (
            f"DaskCluster scheduler: service port {name!r} must target a named container port"
        )


def test_configmap_covers_the_settings_and_points_at_the_services():
    data = configmap()["data"]
    missing = [var for var in (*settings_env(), "PREFECT_API_URL") if not data.get(var)]
    assert not missing, f"configmap.yaml: add {missing} (read by flows/settings.py and the Prefect worker)"
    cluster = dask_cluster()
    port = next(
        p["port"] for p in cluster["spec"]["scheduler"]["service"]["ports"] if p["name"] == "tcp-comm"
    )
    scheduler = f"tcp://{cluster['metadata']['name']}-scheduler.{namespace()}.svc:{port}"
    assert data["DASK_SCHEDULER_ADDRESS"] in (scheduler, scheduler.replace(".svc:", ".svc.cluster.local:")), (
        f"configmap.yaml: DASK_SCHEDULER_ADDRESS should be {scheduler} (the operator names the Service "
        "<DaskCluster name>-scheduler)"
    )
    tracking = urlparse(data["MLFLOW_TRACKING_URI"])
    (service,) = [s for s in k8s_kind("Service") if s["metadata"]["name"] == "mlflow"]
    assert tracking.hostname in (f"mlflow.{namespace()}.svc", f"mlflow.{namespace()}.svc.cluster.local"), (
        f"configmap.yaml: MLFLOW_TRACKING_URI should name the mlflow Service: http://mlflow.{namespace()}.svc:PORT"
    )
    assert tracking.port in [p["port"] for p in service["spec"]["ports"]], (
        f"configmap.yaml: MLFLOW_TRACKING_URI port {tracking.port} is not a port of the mlflow Service"
    )


def test_selectors_match_pod_labels():
    pods = []
    for deployment in k8s_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), (
            f"Deployment {deployment['metadata']['name']}: selector {selector} does not match its pod labels"
        )
        pods.append(labels)
    for service in k8s_kind("Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pods), (
            f"Service {service['metadata']['name']}: selector {selector} matches no Deployment's pods"
        )


def test_secret_and_configmap_references_resolve():
    for container in k8s_containers():
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                assert source["secretRef"]["name"] in secret_keys(), f"{container['name']}: unknown Secret"
            if "configMapRef" in source:
                assert source["configMapRef"]["name"] == configmap()["metadata"]["name"], (
                    f"{container['name']}: envFrom names an unknown ConfigMap {source['configMapRef']['name']}"
                )
        for var in container.get("env") or []:
            ref = var.get("valueFrom") or {}
            if "secretKeyRef" in ref:
                name, key = ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]
                assert key in secret_keys().get(name, ()), (
                    f"{container['name']}: env {var['name']} reads Secret {name} key {key}, which "
                    "secret.example.yaml does not define"
                )
            if "configMapKeyRef" in ref and not ref["configMapKeyRef"].get("optional"):
                assert ref["configMapKeyRef"]["key"] in configmap()["data"], (
                    f"{container['name']}: env {var['name']} reads ConfigMap key {ref['configMapKeyRef']['key']}, "
                    "which configmap.yaml does not define (add it, or mark the reference optional)"
                )


def test_k8s_mlflow_stores_artifacts_where_the_code_expects():
    (deployment,) = [d for d in k8s_kind("Deployment") if d["metadata"]["name"] == "mlflow"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = container_env(container)
    args = [expand(a, env) for a in container["args"]]
    assert args[:2] == ["mlflow", "server"] and "--serve-artifacts" in args, f"mlflow runs {args}"
    destination = option_value(args, "--artifacts-destination") or ""
    assert destination.startswith("s3://"), f"k8s mlflow: --artifacts-destination {destination} is not s3://"
    expected = artifacts_destination_for({k: v for k, v in configmap()["data"].items() if v})
    if expected is not None:
        assert destination == expected, f"k8s mlflow: --artifacts-destination {destination} != {expected}"
    assert "$(" not in " ".join(args), f"k8s mlflow: undefined $(VAR) in {args}"
    tracking = urlparse(configmap()["data"]["MLFLOW_TRACKING_URI"]).netloc
    assert host_allowed(tracking, option_value(args, "--allowed-hosts") or "localhost"), (
        f"k8s mlflow: add {tracking} to --allowed-hosts, or MLflow answers 403 to the clients"
    )


def test_k8s_prefect_worker_polls_the_deployments_pool_with_the_settings():
    (deployment,) = [d for d in k8s_kind("Deployment") if d["metadata"]["name"] == "prefect-worker"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container.get("command", []) + container.get("args", [])
    assert args[:3] == ["prefect", "worker", "start"], f"prefect-worker runs {args}"
    assert option_value(args, "--pool") == expected_work_pool(), "k8s prefect-worker: wrong --pool"
    env = container_env(container)
    missing = [var for var in (*settings_env(), "PREFECT_API_URL", "AWS_ACCESS_KEY_ID") if var not in env]
    assert not missing, f"k8s prefect-worker: {missing} not set (envFrom sweepflow-settings + sweepflow-s3)"


def test_helm_values_match_the_manifests():
    worker = yaml.safe_load(HELM_VALUES.read_text())["worker"]
    assert worker["config"]["workPool"] == expected_work_pool(), "prefect-worker-values.yaml: workPool"
    assert worker["config"].get("type") == "process", "prefect-worker-values.yaml: config.type process"
    assert worker["apiConfig"] == "selfHostedServer", "prefect-worker-values.yaml: apiConfig selfHostedServer"
    assert worker["selfHostedServerApiConfig"]["apiUrl"] == configmap()["data"]["PREFECT_API_URL"], (
        "prefect-worker-values.yaml: selfHostedServerApiConfig.apiUrl != configmap.yaml's PREFECT_API_URL"
    )
    assert worker["extraEnvVarsCM"] == configmap()["metadata"]["name"], (
        "prefect-worker-values.yaml: extraEnvVarsCM should be configmap.yaml's ConfigMap (the settings)"
    )
    assert worker["extraEnvVarsSecret"] in secret_keys(), "prefect-worker-values.yaml: unknown Secret"
    (image,) = kustomization()["images"]
    assert worker["image"]["repository"] == image["newName"], (
        "prefect-worker-values.yaml: worker.image.repository should be kustomization.yaml's image newName"
    )


# ---------------------------------------------------------------------------------------------------------
# The real tools, when installed
# ---------------------------------------------------------------------------------------------------------


def _docker_compose_available() -> bool:
    if not shutil.which("docker"):
        return False
    result = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return result.returncode == 0


@pytest.mark.skipif(not _docker_compose_available(), reason="docker with the compose plugin is not installed")
def test_docker_compose_config_accepts_the_file():
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"docker compose config rejects docker-compose.yml:\n{result.stderr}"


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_manifests():
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize infra/k8s fails:\n{result.stderr}"
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    rendered = [c["image"] for d in docs for c in _containers_anywhere(d)]
    (image,) = kustomization()["images"]
    assert rendered and all(i == f"{image['newName']}:{image['newTag']}" for i in rendered), (
        f"kustomize did not set the image everywhere (the DaskCluster's containers included): {rendered}"
    )


def _containers_anywhere(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [c for c in node.get("containers") or [] if isinstance(c, dict) and "image" in c]
        return found + [c for k, v in node.items() if k != "containers" for c in _containers_anywhere(v)]
    if isinstance(node, list):
        return [c for item in node for c in _containers_anywhere(item)]
    return []
