"""Every public name of ``sweepflow.tune``, ``sweepflow.air`` and ``ddp_runtime`` has a docstring: the API
reference is generated from them (mkdocstrings, Google style), so a name without one is a blank entry.

The rule, per package and each of its public submodules (recursively; a module or package whose name starts with
``_`` is private and skipped):

* the module itself needs a docstring (a module that only mirrors a Ray path says so in it);
* its public names are ``__all__`` when it defines one, else the names not starting with ``_`` whose object is
  defined in that very module (``obj.__module__``), so imported helpers are not counted twice;
* of those, modules, classes and functions (Prefect flows/tasks too: anything wrapping a function) count when
  they are sweepflow's or ddp_runtime's own code -- a re-export of our own class from elsewhere (the schedulers
  from ``sweepflow.tasks.sweep``) counts, a re-exported third-party object does not; plain constants and type
  aliases are not checked (their meaning is in the comment above them, which mkdocstrings does not need);
* a counted class's public methods, static/class methods and properties defined in its own body need one too;
  docstrings inherited from a base class do not count (the reference shows the class's own), nor does the
  ``Name(field, ...)`` text dataclasses and NamedTuples make up;
* a Ray name that is refused (``sweepflow.tune.not_built``) is not a name here: its refusal is its documentation.

Pure introspection: importing the modules starts no server and no cluster.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import Any

from sweepflow.tune.not_built import NotBuiltError

PACKAGES = ["sweepflow.tune", "sweepflow.air", "ddp_runtime"]
OURS = ("sweepflow.", "ddp_runtime")


def _public_modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def _is_ours(obj: Any) -> bool:
    name = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    return isinstance(name, str) and (name.startswith(OURS) or name == "ddp_runtime")


def _is_function_like(obj: Any) -> bool:
    return inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__") and not inspect.isclass(obj))


def _own_doc(obj: Any) -> str | None:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        # dataclasses and NamedTuples make up "Name(field: type, ...)" when the class has none of its own.
        if isinstance(doc, str) and doc.startswith(f"{obj.__name__}("):
            return None
        return doc
    return getattr(obj, "__doc__", None)


def _names(module: ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_"):
            continue
        if inspect.ismodule(obj):
            if obj.__name__ == f"{module.__name__}.{name}":
                names.append(name)
        elif getattr(obj, "__module__", None) == module.__name__:
            names.append(name)
    return names


def _members(cls: type) -> list[tuple[str, Any]]:
    """(qualname suffix, the object whose docstring counts) for the class's own public methods and properties."""
    members = []
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        elif isinstance(attr, property):
            attr = attr.fget
        elif hasattr(attr, "func") and type(attr).__name__ == "cached_property":
            attr = attr.func
        if attr is None or not _is_function_like(attr) or not _is_ours(attr):
            continue
        members.append((name, attr))
    return members


def undocumented(package: str) -> list[str]:
    """Every counted name of ``package`` without a docstring, as ``module.qualname``."""
    missing: list[str] = []
    seen: set[int] = set()

    def check(label: str, obj: Any) -> None:
        doc = _own_doc(obj)
        if not (isinstance(doc, str) and doc.strip()):
            missing.append(label)

    for module in _public_modules(package):
        check(module.__name__, module)
        for name in _names(module):
            try:
                obj = getattr(module, name)
            except NotBuiltError:
                continue
            if not _is_ours(obj) or id(obj) in seen:
                continue
            if not (inspect.ismodule(obj) or inspect.isclass(obj) or _is_function_like(obj)):
                continue
            seen.add(id(obj))
            if inspect.ismodule(obj):
                continue  # a submodule is checked as a module of its own
            where = getattr(obj, "__module__", module.__name__)
            qualname = getattr(obj, "__qualname__", name)
            check(f"{where}.{qualname}", obj)
            if inspect.isclass(obj):
                for member, attr in _members(obj):
                    check(f"{where}.{qualname}.{member}", attr)
    return sorted(set(missing))


def test_every_public_name_has_a_docstring() -> None:
    missing = {package: undocumented(package) for package in PACKAGES}
    lines = [f"  {name}" for names in missing.values() for name in names]
    assert not lines, f"{len(lines)} public names without a docstring (module.qualname):\n" + "\n".join(lines)


def test_the_rule_sees_the_names() -> None:
    """A guard on the rule itself: if imports or ``__all__`` change so that nothing is counted, the test above
    would pass on nothing."""
    from ddp_runtime.torch import TorchTrainer
    from sweepflow.tune import ExperimentAnalysis

    assert inspect.getdoc(TorchTrainer.fit)
    assert inspect.getdoc(ExperimentAnalysis)
    assert len(_public_modules("sweepflow.tune")) > 20
