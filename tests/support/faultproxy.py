"""A TCP proxy for fault injection: 127.0.0.1:<free port> in front of a real server, switchable to an outage.

Tests point a client at the proxy instead of the server, then cut the service for a while without stopping
the server, so its in-memory state (moto's buckets, a server's caches) survives the outage:

    with FaultProxy("127.0.0.1", server_port) as proxy:
        client = make_client(proxy.url)
        proxy.outage(5.0)                                   # from now, for 5 s
        proxy.outage_on(b"/log-batch", 5.0)                 # from the first request that holds these bytes
        proxy.outage_on(b"/log-batch", 5.0, after_reply=True)  # ... once the server has acted on it

During an outage every connection, open or new, fails:

* ``mode="reset"`` (default): open connections are reset (in-flight requests lose their answer, so the client
  cannot tell whether the server acted on them) and new connections are accepted and reset at once;
* ``mode="refuse"``: the listening socket is closed, so new connections are refused (ECONNREFUSED) as by a
  stopped server; it is opened again on the same port when the outage ends.

``outage_on`` cuts *before* forwarding the request that holds the pattern: the server never sees that
request, which makes "the write failed half-way" deterministic. With ``after_reply=True`` the request is
forwarded and the outage starts when the server answers, instead of the answer: the server acted on the
request but the client cannot know (the ambiguous failure a retry must not turn into a double write).
``outage(None)`` lasts until ``restore()``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

__all__ = ["FaultProxy"]

_CHUNK = 65536
_POLL_S = 0.05  # how quickly the threads notice an outage or a stop


@dataclass
class _Stats:
    connections: int = 0  # connections forwarded to the server
    failed: int = 0  # connections reset or refused because of an outage
    outages: list[tuple[float, float | None]] = field(default_factory=list)  # (start, end) monotonic


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed server or a dropped route does, not a polite FIN."""
    with contextlib.suppress(OSError):  # already closed by the peer: nothing left to reset
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``target_host:target_port``; inject outages on demand (see module doc)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, int(target_port))
        self.stats = _Stats()
        self._lock = threading.Lock()
        self._down_until: float | None = None  # monotonic end of the current outage; inf = until restore()
        self._mode = "reset"
        self._trigger: tuple[bytes, float | None, str, bool] | None = None
        self._open: set[socket.socket] = set()  # both ends of every forwarded connection
        self._stop = threading.Event()
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"faultproxy-{self.port}", daemon=True)

    # ------------------------------------------------------------------------------------------ public API
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for sock in list(self._open):
                _reset(sock)
            self._open.clear()
        with contextlib.suppress(OSError):  # closed already by a "refuse" outage
            self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def outage(self, seconds: float | None, *, mode: str = "reset") -> None:
        """Start an outage now, for ``seconds`` (None: until ``restore()``)."""
        if mode not in ("reset", "refuse"):
            raise ValueError(f"mode must be 'reset' or 'refuse', got {mode!r}")
        with self._lock:
            self._start_outage(seconds, mode)

    def outage_on(
        self, pattern: bytes, seconds: float | None, *, mode: str = "reset", after_reply: bool = False
    ) -> None:
        """Start an outage when a client first sends data holding ``pattern``: before that data is forwarded,
        or (``after_reply``) in place of the server's answer to it."""
        if mode not in ("reset", "refuse"):
            raise ValueError(f"mode must be 'reset' or 'refuse', got {mode!r}")
        with self._lock:
            self._trigger = (pattern, seconds, mode, after_reply)

    def restore(self) -> None:
        """End the outage now (and forget a pending ``outage_on``)."""
        with self._lock:
            self._trigger = None
            self._down_until = time.monotonic()

    @property
    def down(self) -> bool:
        with self._lock:
            return self._is_down()

    @property
    def triggered(self) -> bool:
        """An outage has started (by ``outage`` or by its ``outage_on`` pattern)."""
        return bool(self.stats.outages)

    def wait_until_triggered(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.triggered:
                return True
            time.sleep(_POLL_S)
        return False

    # ------------------------------------------------------------------------------------------ internals
    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Reopening the same port after a "refuse" outage must not wait for TIME_WAIT to pass.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.settimeout(_POLL_S)
        return sock

    def _is_down(self) -> bool:  # with self._lock held
        return self._down_until is not None and time.monotonic() < self._down_until

    def _start_outage(self, seconds: float | None, mode: str) -> None:  # with self._lock held
        now = time.monotonic()
        self._mode = mode
        self._down_until = now + seconds if seconds is not None else float("inf")
        self.stats.outages.append((now, self._down_until if seconds is not None else None))
        for sock in list(self._open):  # in-flight requests lose their answers
            _reset(sock)
        self._open.clear()

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                down, mode = self._is_down(), self._mode
            if down and mode == "refuse":
                if self._listener.fileno() != -1:
                    self._listener.close()
                time.sleep(_POLL_S)
                continue
            if self._listener.fileno() == -1:  # a "refuse" outage ended: listen on the same port again
                self._listener = self._listen(self.port)
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            with self._lock:
                if self._is_down():
                    self.stats.failed += 1
                    _reset(client)
                    continue
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            _reset(client)  # the server itself is down: the client sees what it would see without the proxy
            return
        with self._lock:
            if self._is_down():
                self.stats.failed += 1
                _reset(client)
                upstream.close()
                return
            self._open.update((client, upstream))
            self.stats.connections += 1
        peers = {client: upstream, upstream: client}
        open_ends = set(peers)  # sockets still sending; an EOF is passed on as a half-close (FIN)
        cut = False  # an outage (or a trigger) ended the connection: reset it rather than close it
        cut_reply: tuple[float | None, str] | None = None  # an after_reply trigger fired on this connection
        try:
            while open_ends and not self._stop.is_set():
                try:
                    readable, _, _ = select.select(list(open_ends), [], [], _POLL_S)
                except (OSError, ValueError):  # a socket was reset by an outage
                    cut = True
                    return
                for sock in readable:
                    try:
                        data = sock.recv(_CHUNK)
                    except OSError:
                        cut = True
                        return
                    if not data:
                        open_ends.discard(sock)
                        with contextlib.suppress(OSError):  # the peer may be gone already
                            peers[sock].shutdown(socket.SHUT_WR)
                        continue
                    if sock is client:
                        fired = self._fire_trigger(data)
                        if fired is not None and not fired[2]:
                            cut = True  # the request never reaches the server
                            return
                        if fired is not None:
                            cut_reply = (fired[0], fired[1])
                    elif cut_reply is not None:  # the server answered the request: the client never learns it
                        with self._lock:
                            self.stats.failed += 1
                            self._start_outage(*cut_reply)
                        cut = True
                        return
                    try:
                        peers[sock].sendall(data)
                    except OSError:
                        cut = True
                        return
        finally:
            with self._lock:
                self._open.discard(client)
                self._open.discard(upstream)
            if cut:
                _reset(client)
            else:
                client.close()
            upstream.close()

    def _fire_trigger(self, data: bytes) -> tuple[float | None, str, bool] | None:
        """The pending ``outage_on`` (seconds, mode, after_reply) if ``data`` holds its pattern, which fires it:
        a cut before forwarding starts the outage now; an after-reply cut is started by the caller."""
        with self._lock:
            if self._trigger is None or self._trigger[0] not in data:
                return None
            _, seconds, mode, after_reply = self._trigger
            self._trigger = None
            if not after_reply:
                self.stats.failed += 1
                self._start_outage(seconds, mode)
            return seconds, mode, after_reply
