"""``tune.create_scheduler`` / ``tune.create_searcher``'s one lowering: Ray's name for a class -> the class, built
with the keywords given, an unknown keyword refused by name (Ray drops it silently)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any


def create_by_ray_name(
    what: str, name: str, names: Mapping[str, tuple[str, str]], kwargs: dict[str, Any]
) -> Any:
    """``names[name.lower()]`` is ``(module, class name)``: the class, looked up there (a class that is not built is
    refused by the module's ``__getattr__``), called with ``kwargs``.

    Raises:
        ValueError: an unknown name (the known ones listed), or keywords the class does not take.
    """
    key = str(name).lower()
    if key not in names:
        raise ValueError(f"tune.create_{what}({name!r}): the name must be one of {list(names)}")
    module, class_name = names[key]
    cls = getattr(importlib.import_module(module), class_name)
    accepted = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise ValueError(
                f"tune.create_{what}({key!r}, ...): {cls.__name__} takes no {', '.join(unknown)} (Ray drops such "
                f"keywords silently; here they are refused so a typo is not lost); it takes {', '.join(accepted) or 'none'}"
            )
    return cls(**kwargs)
