"""The product's files and functions each have one job: no function is over 80 lines (issue 67: functions split
by job, not files trimmed to a cap), none of its Python modules is over 600 lines (issue 38), and no two of
ddp_runtime's modules import each other (issue 67), even for type hints only."""

from __future__ import annotations

import ast
from pathlib import Path

import paths

ROOT = paths.ROOT
PRODUCT = ("flows", "tasks", "ddp_runtime", "infra")
MAX_LINES = 600
#: A function's lines from its ``def`` to its last line: signature, docstring and nested functions included.
MAX_FUNCTION_LINES = 80


def _product_modules():
    for top in PRODUCT:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                yield path


def test_no_product_function_is_over_80_lines():
    functions = {}
    for path in _product_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = (
                    node.end_lineno - node.lineno + 1
                )
    assert len(functions) > 1000  # the tree was found
    over = {name: lines for name, lines in sorted(functions.items()) if lines > MAX_FUNCTION_LINES}
    assert not over, f"split these by job (at most {MAX_FUNCTION_LINES} lines each): {over}"


def test_no_product_module_is_over_600_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in _product_modules()
    }
    assert len(sizes) > 100  # the tree was found
    over = {path: lines for path, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert not over, f"split these along their jobs (at most {MAX_LINES} lines each): {over}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level(tree: ast.Module):
    """The statements a module runs when imported, and those under its top-level ``if`` (``TYPE_CHECKING``)
    and ``try``; not the imports inside functions (deferred on purpose)."""
    for node in tree.body:
        if isinstance(node, ast.If):
            yield from (*node.body, *node.orelse)
        elif isinstance(node, ast.Try):
            yield from node.body
        else:
            yield node


def _import_cycles(root: Path, package: str) -> list[list[str]]:
    modules = {
        _module_name(p, root): p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts
    }
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found |= {sub} if sub in modules else ({node.module} & modules.keys())
        edges[name] = found - {name}
    # Tarjan's strongly connected components: each one of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def test_no_two_ddp_runtime_modules_import_each_other(tmp_path):
    assert _import_cycles(ROOT, "ddp_runtime") == []
    # The check sees a cycle through a TYPE_CHECKING import (the shape issue 67 found in ddp_runtime/data), and
    # not a deferred import inside a function.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nclass B: ...\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("from pkg import a\n")
    (tmp_path / "pkg" / "d.py").write_text("def f():\n    from pkg import c\n")
    assert _import_cycles(tmp_path, "pkg") == [["pkg.a", "pkg.b"]]


#: Ray's faces keep Ray's names: their folder is under flows/, their import path is not (docs/internals.md).
FACES = {"flows/tune": "sweepflow.tune", "flows/air": "sweepflow.air", "flows/sgd": "sweepflow.sgd"}


def _import_path(folder: str) -> str:
    """A product folder's import path: ``sweepflow.`` + its path, ``ddp_runtime`` as it is, a face by Ray's name."""
    for face, name in FACES.items():
        if folder == face or folder.startswith(face + "/"):
            return name + folder[len(face) :].replace("/", ".")
    dotted = folder.replace("/", ".")
    return dotted if folder.split("/")[0] == "ddp_runtime" else f"sweepflow.{dotted}"


def test_a_module_is_found_from_its_import_path_in_one_step():
    """Every package folder of the product is a package of the wheel under its folder's import path, and
    pyproject maps each import root to its folder in one line (no nested remaps): a newcomer reading
    ``sweepflow.infra.services.stack`` opens infra/services/stack.py. A subpackage left out of the list would be
    missing from the wheel while the checkout's editable install still imports it."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the backport the dev extra installs there
        import tomli as tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {
        "sweepflow.flows": "flows",
        "sweepflow.tasks": "tasks",
        "sweepflow.infra": "infra",
        **{name: folder for folder, name in FACES.items()},
    }
    folders = sorted(
        str(init.parent.relative_to(ROOT))
        for top in PRODUCT
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    assert "infra/services" in folders and "flows/tune/schedulers" in folders  # the tree was found
    assert sorted(setuptools["packages"]) == sorted(_import_path(folder) for folder in folders)
