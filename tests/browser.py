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


def _chromium_args(profile: str) -> list[str]:
    """Headless Chromium with a profile of its own: never the user's, never shared."""
    return [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}"]


def _run(url: str, profile: str, *args: str, wait_ms: int) -> subprocess.CompletedProcess[str]:
    cmd = [
        *_chromium_args(profile),
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


def page_showing(
    url: str,
    profile: str,
    *needles: str,
    timeout_s: float = 120,
    size: tuple[int, int] = (1400, 900),
    screenshot_path: str | None = None,
    script: str | None = None,
) -> str:
    """The page's DOM once it shows every needle (or, at ``timeout_s`` of real time, as it is then), and its
    screenshot taken at that moment if ``screenshot_path`` is given.

    For single-page apps that fetch their data in several requests (Prefect's UI: a task run, then its logs): the
    page is driven over the DevTools protocol and its DOM read every half second, on the wall clock. A virtual-time
    budget (``rendered_dom``) ends when the page goes idle on a loaded machine, before a slow fetch has landed.
    ``script``: JavaScript evaluated before each read (a click on a tab the URL cannot select)."""
    import base64
    import json
    import time
    import urllib.request

    from websockets.sync.client import connect

    os.makedirs(profile, exist_ok=True)
    port_file = os.path.join(profile, "DevToolsActivePort")
    cmd = [
        *_chromium_args(profile),
        "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",  # a free port, written to port_file
        f"--window-size={size[0]},{size[1]}", "about:blank",
    ]  # fmt: skip
    log_path = f"{profile}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not os.path.isfile(port_file) or not open(port_file).read().strip():
            assert proc.poll() is None, f"chromium exited with {proc.returncode}: {open(log_path).read()[-3000:]}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port within 30 s"
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
        targets = json.load(direct.open(f"http://127.0.0.1:{port}/json/list", timeout=30))
        page = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(page, max_size=None, open_timeout=30) as ws:
            calls = iter(range(1, 1_000_000))

            def call(method: str, **params: object) -> dict:
                n = next(calls)
                ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while True:  # events in between are not ours
                    message = json.loads(ws.recv(timeout=60))
                    if message.get("id") == n:
                        assert "error" not in message, f"{method}: {message['error']}"
                        return message["result"]

            call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while True:
                if script is not None:  # e.g. a click on a tab, once the page has drawn it
                    call("Runtime.evaluate", expression=script)
                dom = call("Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True)
                dom = dom["result"].get("value", "")
                if all(needle in dom for needle in needles) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if screenshot_path is not None:
                time.sleep(1)  # what it just drew (fonts, a chart's transition) settles
                png = call("Page.captureScreenshot", format="png")["data"]
                with open(screenshot_path, "wb") as f:
                    f.write(base64.b64decode(png))
            return dom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
        os.remove(log_path)
