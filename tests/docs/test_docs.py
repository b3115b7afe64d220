"""The documentation: the site builds strict, its generated references are whole, and every code block in it runs.

``mkdocs build --strict`` fails on a broken link, a page missing from the navigation, an anchor that does not
exist or an API reference (``::: module``) that does not resolve. The configuration and command-line references
are generated at build time (docs/hooks.py): every field and every option must be in them.

Every fenced code block of README.md, CONTRIBUTING.md, benchmarks/RESULTS.md and docs/**/*.md is run here or
marked by the HTML comment on the line before it (docs/testing.md lists the marks):

- ``<!-- illustration ... -->``: not run (output, fragments, commands that need GPUs, other machines or minutes);
- ``<!-- mirrored by tests/FILE.py::[Class::]test -->``: needs services; the named test does it (it must exist);
- ``<!-- ci: .ci/run -->``: commands .ci/run runs as written (README's two set-up commands, docs/install.md's
  install outside the clone): each command must be a line of .ci/run;
- ``<!-- makefile: VAR -->``: the block is the value of the Makefile's VAR;
- ``<!-- pipeline-config ... -->``: a YAML block validated as a ``PipelineConfig``;
- unmarked ``python``: run in a fresh interpreter in a temporary directory;
- unmarked ``bash``: run when its commands are ``sweepflow ... --help`` or ``sweepflow init``; else it must be marked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import paths
import pytest

ROOT = paths.ROOT
VENV_BIN = Path(sys.executable).parent

DOC_FILES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "RESULTS.md", *(ROOT / "docs").rglob("*.md")]
)
FENCE = re.compile(r"^(```+)(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(illustration|mirrored by|ci:|makefile:|pipeline-config)(.*?)-->\s*$")
# The commands an unmarked shell block may hold (they start no service): help, and `sweepflow init`.
RUNNABLE = re.compile(r"^\.venv/bin/sweepflow( [a-z]+)* --help$|^\.venv/bin/sweepflow init [\w./-]+$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    mark: str  # "" when unmarked
    mark_arg: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, lang = opened.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence)
        before = lines[i - 1].strip() if i > 0 else ""
        mark = MARK.match(before)
        found.append(
            Block(
                path,
                i + 1,
                lang,
                mark.group(1) if mark else "",
                mark.group(2).strip() if mark else "",
                "\n".join(lines[i + 1 : end]) + "\n",
            )
        )
        i = end + 1
    return found


BLOCKS = [block for path in DOC_FILES for block in _blocks(path)]


def _commands(code: str) -> list[str]:
    """A shell block's commands: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def test_the_docs_have_code_blocks_and_each_file_is_found():
    assert (ROOT / "docs" / "index.md") in DOC_FILES and len(BLOCKS) > 20


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_every_code_block_runs_or_is_marked(block: Block, tmp_path):
    if block.mark == "illustration":
        return
    if block.mark == "mirrored by":
        target = block.mark_arg.split()[0]
        file, *names = target.split("::")
        source = (ROOT / file).read_text()
        assert names, f"{block.id}: name the test, e.g. tests/<folder>/test_x.py::test_y"
        *classes, test = names
        for cls in classes:
            assert re.search(rf"^class {cls}\b", source, re.M), f"{block.id}: {file} has no class {cls}"
        assert re.search(rf"^\s*def {test}\(", source, re.M), f"{block.id}: {file} has no test {test}"
        return
    if block.mark == "ci:":
        ci = (ROOT / ".ci" / "run").read_text()
        for command in _commands(block.code):
            assert re.search(rf"^\s*(\S+=\S+\s+)*{re.escape(command)}(\s|$)", ci, re.M), (
                f"{block.id}: `{command}` is not what .ci/run runs"
            )
        return
    if block.mark == "makefile:":
        makefile = (ROOT / "Makefile").read_text()
        value = re.search(rf"^{block.mark_arg}\s*\??=\s*(.*)$", makefile, re.M)
        assert value, f"{block.id}: the Makefile has no {block.mark_arg}"
        assert block.code.strip() == value.group(1).strip(), f"{block.id}: not the Makefile's {block.mark_arg}"
        return
    if block.mark == "pipeline-config":
        import yaml

        from sweepflow.flows.config import PipelineConfig

        PipelineConfig.model_validate(yaml.safe_load(block.code))
        return
    if block.lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text(block.code)
        out = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 0, f"{block.id} failed:\n{out.stderr[-3000:]}"
        return
    if block.lang in ("bash", "sh", "shell"):
        commands = _commands(block.code)
        unrunnable = [c for c in commands if not RUNNABLE.match(c)]
        assert not unrunnable, (
            f"{block.id}: {unrunnable} cannot run here: mark the block <!-- illustration --> or "
            "<!-- mirrored by tests/FILE.py::TEST --> (the test that does what it shows)"
        )
        for command in commands:
            argv = command.split()
            argv[0] = str(VENV_BIN / Path(argv[0]).name)
            out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, f"{block.id}: `{command}` failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        return
    pytest.fail(f"{block.id}: a {block.lang or 'plain'} block that is neither run nor marked (see this module's doc)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return out


def test_the_site_builds_strict_with_its_api_references(site):
    for page in ("index.html", "quickstart/index.html", "reference/tune/index.html", "benchmark-results/index.html"):
        assert (site / page).is_file(), page
    tune = (site / "reference" / "tune" / "index.html").read_text()
    assert 'id="sweepflow.tune.api.run"' in tune and 'id="sweepflow.tune.api.Tuner"' in tune
    assert 'id="ddp_runtime.torch.TorchTrainer"' in (site / "reference" / "ddp_runtime" / "index.html").read_text()


def test_the_configuration_reference_has_every_field_of_every_section(site):
    from pydantic import BaseModel

    from sweepflow.flows.config import PipelineConfig

    page = (site / "reference" / "configuration" / "index.html").read_text()

    def models(annotation):
        import typing

        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for a in typing.get_args(annotation) for m in models(a)]

    missing = []
    for name, field in PipelineConfig.model_fields.items():
        sections = models(field.annotation)
        if not sections:
            missing += [name] if f"<code>{name}</code>" not in page else []
        for section in sections:
            missing += [
                f"{name}.{sub}" for sub in section.model_fields if f"<code>{name}.{sub}</code>" not in page
            ]
    assert not missing, f"the configuration reference lacks {missing}"


def test_the_cli_reference_has_every_command_and_option(site):
    import argparse

    from sweepflow.flows.cli import build_parser

    page = (site / "reference" / "cli" / "index.html").read_text()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, sub in commands.choices.items():
        missing += [name] if f"sweepflow {name}" not in page else []
        for action in sub._actions:
            missing += [o for o in action.option_strings if o not in ("-h", "--help") and o not in page]
    assert not missing, f"the CLI reference lacks {missing}"
