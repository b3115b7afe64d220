"""benchmarks/ray_examples.py's rewrites, which decide what each system runs: this repository's Ray 2 ports go
back to Ray's spelling for the Ray side (``unported``), and Ray's spelling comes forward to sweepflow's
(``ported``) as the ports have it."""

from __future__ import annotations

import ast
import os
import sys

import paths
import pytest

ROOT = str(paths.ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from ray_examples import EXAMPLES, Run, ported, unported, where_time_went  # noqa: E402

REPO_EXAMPLES = [e.source.partition(":")[2] for e in EXAMPLES if e.source.startswith("repo:")]


def _imports(text: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


@pytest.mark.parametrize("path", REPO_EXAMPLES)
def test_a_ports_imports_go_back_to_rays_and_forward_again(path):
    ours = open(os.path.join(ROOT, path)).read()
    theirs = unported(ours)
    assert not {m for m in _imports(theirs) if m.split(".")[0] in ("sweepflow", "ddp_runtime")}, path
    assert {m for m in _imports(theirs) if m.split(".")[0] == "ray"}, path
    code = "\n".join(line for line in theirs.splitlines() if not line.lstrip().startswith("#"))
    assert "ddp_runtime." not in code.split('"""', 2)[-1], path  # no call left in sweepflow's spelling
    assert _imports(ported(theirs)) == _imports(ours), path


def test_where_sweepflows_time_went_is_read_from_its_log():
    log = (
        "03:18:33.739 | INFO    | Flow run 'x-1' - Beginning flow run 'x-1' for flow 'tune-experiment'\n"
        "03:19:10.898 | INFO    | Flow run 'x-1' - sweep ended in 37.0s: 8 trial(s) used 70.4 worker-seconds (...)\n"
        "03:19:11.696 | INFO    | Flow run 'x-1' - Finished in state Completed()\n"
    )
    import datetime

    started = datetime.datetime(2026, 12, 2, 3, 18, 22, 500000).timestamp()
    went = where_time_went(Run(True, 49.0, "", log, started))
    assert went == "before 11.2 s, flow 38.0 s, after -0.2 s; trials 70.4 worker-s"
