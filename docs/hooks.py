"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated reference pages.

A page holding a marker gets it replaced, at every build, by tables generated from the code itself, so the
reference can never go stale:

- ``<!-- sweepflow:config-reference -->``: every field of every section of ``PipelineConfig`` (its pydantic
  schema): name, type, default, description.
- ``<!-- sweepflow:cli-reference -->``: every command and subcommand of ``sweepflow`` (``flows/cli.py``'s
  ``build_parser()``): its help, usage and options.

``tests/docs/test_docs.py`` builds the site strict and checks both tables hold every field and every option.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any

CONFIG_MARKER = "<!-- sweepflow:config-reference -->"
CLI_MARKER = "<!-- sweepflow:cli-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


# --- the configuration ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """A table cell: one line, pipes escaped."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _first_sentence(doc: str | None) -> str:
    return _cell(doc or "").split(". ")[0].rstrip(".")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if hasattr(value, "model_dump"):
        return "(the section's defaults)"
    return "`" + json.dumps(value, default=str).replace("|", "\\|") + "`"


def _constraints(field: Any) -> str:
    shown = []
    for item in field.metadata:
        for name, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            bound = getattr(item, name, None)
            if bound is not None:
                shown.append(f"{sign} {bound}")
    return f" ({', '.join(shown)})" if shown else ""


def _section_models(annotation: Any) -> list[type]:
    """The pydantic models a field's type is made of (a section, or each member of a tagged union)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _section_models(a)]


def _fields_table(model: type, prefix: str) -> list[str]:
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        description = field.description or (f"Selects this section ({name}: {field.default})" if name == "type" else "")
        rows.append(
            f"| `{prefix}{name}` | {_type_name(field.annotation)}{_constraints(field)} | {_default(field)} "
            f"| {_cell(description)} |"
        )
    return rows


def config_reference() -> str:
    from sweepflow.flows.config import PipelineConfig

    out = [
        "Generated from `PipelineConfig`'s pydantic schema (`flows/config.py`) when this site was built.",
        "",
        "### Top level",
        "",
    ]
    sections = []
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in PipelineConfig.model_fields.items():
        models = _section_models(field.annotation)
        if models:
            sections.append((name, field, models))
            about = field.description or (
                _first_sentence(models[0].__doc__)
                if len(models) == 1
                else f"one of {len(models)} sections, chosen by `{name}.type`"
            )
            rows.append(f"| `{name}` | section | see [{name}](#{name}) | {_cell(about)} |")
        else:
            rows.append(
                f"| `{name}` | {_type_name(field.annotation)}{_constraints(field)} | {_default(field)} "
                f"| {_cell(field.description or '')} |"
            )
    out += rows
    for name, field, models in sections:
        out += ["", f"### {name}", ""]
        if len(models) > 1:
            default = field.default_factory() if field.default_factory else field.default
            out += [
                f"One of {len(models)} sections, chosen by `{name}.type` (default: "
                f"`{getattr(default, 'type', '?')}`).",
                "",
            ]
            for model in models:
                kind = model.model_fields["type"].default
                out += [f"#### {name}.type: {kind}", "", _cell(model.__doc__ or ""), ""]
                out += _fields_table(model, f"{name}.")
                out.append("")
        else:
            (model,) = models
            out += [_first_sentence(model.__doc__) + ".", ""] if model.__doc__ else []
            out += _fields_table(model, f"{name}.")
    return "\n".join(out) + "\n"


# --- the command line -------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | help | default |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = action.metavar or action.dest
            if action.choices:
                name += " {" + ",".join(action.choices) + "}"
        default = "" if action.default in (None, False, [], argparse.SUPPRESS) else f"`{action.default}`"
        rows.append(f"| `{name}` | {_cell(action.help or '')} | {default} |")
    return rows


def cli_reference() -> str:
    from sweepflow.flows.cli import build_parser

    parser = build_parser()
    out = [
        "Generated from the `sweepflow` command's parser (`flows/cli.py`, `build_parser()`) when this site was "
        "built; `sweepflow COMMAND --help` prints the same.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = _subcommands(parser)
    out += [f"| [`sweepflow {name}`](#sweepflow-{name}) | {_cell(help_)} |" for name, help_, _ in commands]
    for name, help_, sub in commands:
        out += ["", f"### sweepflow {name}", "", _cell(help_) + ".", ""]
        if sub.description:
            out += [_cell(sub.description), ""]
        out += ["```text", sub.format_usage().strip(), "```", ""]
        out += _options_table(sub)
    return "\n".join(out) + "\n"
