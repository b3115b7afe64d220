"""Headless Chromium for the tests that look at pages: the sweep report, the MLflow UI of a finished sweep."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def chromium() -> str:
    """The browser binary; the calling test fails (not skips) without it, unless SWEEPFLOW_SKIP_BROWSER_TESTS=1."""
    if os.environ.get("SWEEPFLOW_SKIP_BROWSER_TESTS") == "1":
        pytest.skip("SWEEPFLOW_SKIP_BROWSER_TESTS=1")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary:
        return binary
    # A failure, not a skip: a skipped render test reads as green while nobody has looked at the page.
    pytest.fail(
        "chromium is not installed: this test renders a page in a headless browser. Install it "
        "(Debian: `apt-get install -y --no-install-recommends chromium`, or `bash scripts/install-browser.sh`) "
        "or set SWEEPFLOW_SKIP_BROWSER_TESTS=1.",
        pytrace=False,
    )


def _run(url: str, profile: str, *args: str, wait_ms: int) -> subprocess.CompletedProcess[str]:
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",  # a profile of its own: never the user's, never shared
        # Time for a single-page app (MLflow's UI) to fetch its data and render, on a virtual clock.
        f"--virtual-time-budget={wait_ms}",
        *args,
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def screenshot(url: str, path: str, *, size: tuple[int, int] = (1280, 2400), wait_ms: int = 2000) -> str:
    _run(url, f"{path}.profile", f"--window-size={size[0]},{size[1]}", f"--screenshot={path}", wait_ms=wait_ms)
    assert os.path.isfile(path), f"chromium wrote no screenshot of {url}"
    shutil.rmtree(f"{path}.profile", ignore_errors=True)
    return path


def rendered_dom(url: str, profile: str, *, wait_ms: int = 15000) -> str:
    """The page's DOM after its scripts ran (what a user would see, as HTML)."""
    return _run(url, profile, "--dump-dom", wait_ms=wait_ms).stdout
