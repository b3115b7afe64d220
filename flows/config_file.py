"""A pipeline config from a YAML file and ``key=value`` overrides (``sweepflow run --config FILE --set ...``),
and pydantic's errors said as a user writes the keys."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.scheduler_settings import SCHEDULER_SECTIONS, SCHEDULER_TYPES


def config_problem(error: Mapping[str, Any]) -> str:
    """One of pydantic's errors as ``key: reason``, the key as a user writes it: a scheduler's type is the value
    of ``scheduler.type``, not a level of keys (pydantic puts the tagged union's tag in the location)."""
    parts = [str(part) for part in error["loc"]]
    reason = str(error["msg"]).removeprefix("Value error, ")
    if len(parts) >= 2 and parts[0] == "scheduler" and parts[1] in SCHEDULER_TYPES:
        kind = parts.pop(1)
        if error["type"] == "extra_forbidden":
            reason = f"not a setting of scheduler.type={kind!r} ({SCHEDULER_SECTIONS[kind].__doc__.split(':')[0]})"
    field = ".".join(parts)
    return f"{field}: {reason}" if field else reason


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML: numbers, bools, lists, dicts)."""
    import yaml

    result = {k: v for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value (e.g. sweep.num_samples=4), got {item!r}")
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = yaml.safe_load(text)
    return result


def load_config_file(path: str | os.PathLike[str] | None, overrides: list[str] = ()) -> PipelineConfig:  # type: ignore[assignment]
    """A ``PipelineConfig`` from a YAML file (``sweepflow run --config FILE``, a project's deployment) and
    ``key=value`` overrides. Paths in the file are relative to the file: ``project_dir`` (default: the file's
    directory) and a local ``data.source``. Raises ValueError saying what is wrong (pydantic's field and reason)."""
    import yaml

    raw: dict[str, Any] = {}
    if path:
        with open(path) as f:
            try:
                raw = yaml.safe_load(f) or {}
            except yaml.YAMLError as exc:  # says where: line and column
                raise ValueError(f"{path} is not valid YAML: {exc}; fix the file's syntax") from None
        if not isinstance(raw, dict):
            raise ValueError(
                f"{path} must hold a mapping of PipelineConfig sections (data:, sweep:, ...), got a {type(raw).__name__}"
            )
        base = os.path.dirname(os.path.abspath(path))
        raw = dict(raw)
        raw["project_dir"] = os.path.join(base, os.path.expanduser(str(raw.get("project_dir") or ".")))
        raw["project_dir"] = os.path.normpath(raw["project_dir"])
        data = raw.get("data")
        source = data.get("source") if isinstance(data, dict) else None
        if isinstance(source, str) and "://" not in source and not os.path.isabs(os.path.expanduser(source)):
            raw["data"] = {**data, "source": os.path.normpath(os.path.join(base, source))}
    try:
        return PipelineConfig.model_validate(apply_overrides(raw, list(overrides)))
    except yaml.YAMLError as exc:  # a --set value that is not YAML
        raise ValueError(f"a --set value is not valid YAML: {exc}") from None
