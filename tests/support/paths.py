"""Where things are, for tests at any depth of ``tests/``: the checkout's root, the tests' root and this folder
(helpers, stand-in servers, the example projects)."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
