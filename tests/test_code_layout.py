"""The product's files each have one job (issue 38): none of its Python modules is over 600 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("flows", "tasks", "ddp_runtime", "infra")
MAX_LINES = 600


def test_no_product_module_is_over_600_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for top in PRODUCT
        for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert len(sizes) > 100  # the tree was found
    over = {path: lines for path, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert not over, f"split these along their jobs (at most {MAX_LINES} lines each): {over}"
