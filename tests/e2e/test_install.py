"""The namespaced install: the project's code imports as ``sweepflow.*`` and ``ddp_runtime`` only, so installing
sweepflow puts no generic ``flows`` or ``tasks`` package on anyone's path (pyproject's ``[tool.setuptools]``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import paths
import pytest

ROOT = str(paths.ROOT)

_PROBE = """
import importlib, json
outcome = {}
for name in ("flows", "tasks", "sweepflow.flows.pipeline", "sweepflow.tasks.sweep.trial", "sweepflow.infra.services.stack",
             "ddp_runtime"):
    try:
        importlib.import_module(name)
        outcome[name] = "ok"
    except ImportError as exc:
        outcome[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(outcome))
"""


@pytest.mark.subprocess
def test_the_installed_project_imports_under_its_own_names_only(tmp_path):
    # Outside the checkout and without the tests' PYTHONPATH: only what the install provides is importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["flows"].startswith("ModuleNotFoundError"), outcome
    assert outcome["tasks"].startswith("ModuleNotFoundError"), outcome
    for name in (
        "sweepflow.flows.pipeline",
        "sweepflow.tasks.sweep.trial",
        "sweepflow.infra.services.stack",
        "ddp_runtime",
    ):
        assert outcome[name] == "ok", f"{name}: {outcome[name]}"


def test_the_wheel_has_only_the_sweepflow_and_ddp_runtime_packages(tmp_path):
    # Built from a copy, so the build's own files (build/, *.egg-info) never land in the checkout.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".lanes", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests", "benchmarks", "site"
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("sweepflow-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"sweepflow", "ddp_runtime"}, sorted(top)
    for path in (
        "sweepflow/flows/pipeline.py",
        "sweepflow/infra/services/launcher.py",
        "sweepflow/tasks/sweep/trial.py",
        "ddp_runtime/torch.py",
    ):
        assert path in names, f"{path} is missing from {wheel.name}"
    assert "sweepflow/__init__.py" not in names, "sweepflow is a namespace package: it has no __init__.py"
    # Every package folder of the source is in the wheel (a subpackage left out of [tool.setuptools] packages
    # works in the editable install, and is missing for everyone who installs the wheel).
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (the dev extra)
        import tomli as tomllib
    from pathlib import Path

    root = Path(ROOT)
    # One line per import root; ddp_runtime is its own root, at its own folder (no line needed).
    folders = {
        **tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"],
        "ddp_runtime": "ddp_runtime",
    }
    by_folder = {folder: name for name, folder in folders.items()}
    missing = []
    for folder in sorted({f for f in folders.values() if "/" not in f}):
        for init in sorted((root / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(root).as_posix()
            if "__pycache__" in rel:
                continue
            name = by_folder.get(rel)
            if name is None:  # a folder inside a mapped one: the mapped one's name, then its path
                parent = max((f for f in by_folder if rel.startswith(f + "/")), key=len)
                name = by_folder[parent] + "." + rel[len(parent) + 1 :].replace("/", ".")
            if f"{name.replace('.', '/')}/__init__.py" not in names:
                missing.append(f"{rel} ({name})")
    assert not missing, f"package folders missing from {wheel.name}: {missing}; add them to [tool.setuptools] packages"
