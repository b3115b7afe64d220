"""Headless Chromium for the tests that look at pages: the sweep report, the MLflow UI of a finished sweep.

One `Browser` is one Chromium driven over the DevTools protocol. A module that opens many pages keeps one (the
``browser`` fixture): every page is still a full load, in a new tab, but the process and its caches are
shared. MLflow's UI is a 4.4-MB script bundle; compiling it in a new browser costs ~7 CPU-s a page,
in a warm one ~2.5 (measured 2026-11-29).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator

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


#: Headless Chromium's own window when none is asked for.
DEFAULT_SIZE = (800, 600)


class Browser:
    """One headless Chromium with a profile of its own (never the user's, never shared), removed on exit."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self._proc: subprocess.Popen | None = None
        self._ws = None
        self._ids = iter(range(1, 1_000_000_000))
        self._events: list[tuple[str | None, str]] = []

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        os.makedirs(self.profile, exist_ok=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        cmd = [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={self.profile}",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",  # a free port, written to port_file
            "about:blank",
        ]  # fmt: skip
        self._log_path = f"{self.profile}.log"
        with open(self._log_path, "w") as log:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 30
            while not os.path.isfile(port_file) or not open(port_file).read().strip():
                assert self._proc.poll() is None, (
                    f"chromium exited with {self._proc.returncode}: {self._log()}"
                )
                assert time.monotonic() < deadline, "chromium did not open its DevTools port within 30 s"
                time.sleep(0.1)
            port = int(open(port_file).read().split()[0])
            # Loopback: never through a proxy.
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            version = json.load(direct.open(f"http://127.0.0.1:{port}/json/version", timeout=30))
            self._ws = connect(version["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        shutil.rmtree(self.profile, ignore_errors=True)
        if os.path.exists(self._log_path):
            os.remove(self._log_path)

    def _log(self) -> str:
        with open(self._log_path) as f:
            return f.read()[-3000:]

    def _receive(self, timeout: float) -> dict:
        assert self._proc is not None and self._proc.poll() is None, f"chromium exited: {self._log()}"
        message = json.loads(self._ws.recv(timeout=timeout))
        # Only a page's events are awaited (`_wait_for_event`); the browser's own are dropped.
        if "method" in message and "sessionId" in message:
            self._events.append((message["sessionId"], message["method"]))
        return message

    def call(self, method: str, session: str | None = None, **params: object) -> dict:
        """One DevTools command (to the page of ``session``, or to the browser), its result; events that arrive
        meanwhile are kept for `_wait_for_event`."""
        n = next(self._ids)
        command = {"id": n, "method": method, "params": params}
        if session is not None:
            command["sessionId"] = session
        self._ws.send(json.dumps(command))
        while True:
            message = self._receive(timeout=60)
            if message.get("id") == n:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def _wait_for_event(self, session: str, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (session, method) not in self._events:
            left = deadline - time.monotonic()
            assert left > 0, f"no {method} within {timeout:.0f} s"
            self._receive(timeout=left)

    @contextlib.contextmanager
    def _page(self, url: str, size: tuple[int, int], *, virtual_time: bool) -> Iterator[str]:
        """A new tab showing ``url`` at ``size`` (on a paused virtual clock if ``virtual_time``), closed after.

        A tab per page: a page whose virtual clock was set running again keeps a core busy (5 CPU-s in 5 s,
        measured), and a live page (Prefect's UI polls its API) would go on working."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = None
        try:
            session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.call("Emulation.setDeviceMetricsOverride", session, width=size[0], height=size[1],
                      deviceScaleFactor=1, mobile=False)  # fmt: skip
            if virtual_time:
                self.call("Emulation.setVirtualTimePolicy", session, policy="pause")
            navigated = self.call("Page.navigate", session, url=url)
            # e.g. a download: {"errorText": "net::ERR_ABORTED", "isDownload": true}
            assert "errorText" not in navigated, f"{url}: {navigated['errorText']} ({navigated})"
            yield session
        finally:
            self.call("Target.closeTarget", targetId=target)
            self._events = [event for event in self._events if event[0] != session]

    def _dom(self, session: str) -> str:
        expression = "document.documentElement.outerHTML"
        return self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)[
            "result"
        ].get("value", "")

    def _screenshot(self, session: str, path: str) -> str:
        png = self.call("Page.captureScreenshot", session, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))
        return path

    def _settle(self, session: str, wait_ms: int) -> None:
        """Runs the page's clock for ``wait_ms`` of virtual time, which stands still while a fetch is pending: time
        for a single-page app (MLflow's UI) to fetch its data and render, whatever the machine's load."""
        self.call(
            "Emulation.setVirtualTimePolicy", session, policy="pauseIfNetworkFetchesPending", budget=wait_ms
        )
        self._wait_for_event(session, "Emulation.virtualTimeBudgetExpired", timeout=120)

    def rendered_dom(self, url: str, *, wait_ms: int = 15000, size: tuple[int, int] = DEFAULT_SIZE) -> str:
        """The page's DOM after its scripts ran for ``wait_ms`` of virtual time (what a user would see, as HTML)."""
        with self._page(url, size, virtual_time=True) as session:
            self._settle(session, wait_ms)
            return self._dom(session)

    def screenshot(
        self, url: str, path: str, *, size: tuple[int, int] = (1280, 2400), wait_ms: int = 2000
    ) -> str:
        """A PNG of the page after its scripts ran for ``wait_ms`` of virtual time."""
        with self._page(url, size, virtual_time=True) as session:
            self._settle(session, wait_ms)
            return self._screenshot(session, path)

    def page_showing(
        self,
        url: str,
        *needles: str,
        timeout_s: float = 120,
        size: tuple[int, int] = (1400, 900),
        screenshot_path: str | None = None,
        script: str | None = None,
    ) -> str:
        """The page's DOM once it shows every needle (or, at ``timeout_s`` of real time, as it is then), and its
        screenshot taken at that moment if ``screenshot_path`` is given.

        For single-page apps that fetch their data in several requests (Prefect's UI: a task run, then its logs):
        the DOM is read every half second, on the wall clock. A virtual-time budget (`rendered_dom`) ends when the
        page goes idle on a loaded machine, before a slow fetch has landed. ``script``: JavaScript evaluated before
        each read (a click on a tab the URL cannot select)."""
        with self._page(url, size, virtual_time=False) as session:
            deadline = time.monotonic() + timeout_s
            while True:
                if script is not None:  # e.g. a click on a tab, once the page has drawn it
                    self.call("Runtime.evaluate", session, expression=script)
                dom = self._dom(session)
                if all(needle in dom for needle in needles) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if screenshot_path is not None:
                time.sleep(1)  # what it just drew (fonts, a chart's transition) settles
                self._screenshot(session, screenshot_path)
            return dom


def page_showing(url: str, profile: str, *needles: str, **kwargs) -> str:
    """`Browser.page_showing` in a browser of its own (benchmarks/bench_report.py: one page per size)."""
    with Browser(profile) as browser:
        return browser.page_showing(url, *needles, **kwargs)
