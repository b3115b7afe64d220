"""Hosts on one machine: network namespaces joined by a bridge (made and removed here; root needed), each with
its own address in a private /24 that nothing on the machine routes, the root namespace joined to it too.
Traffic goes to loopback and to these namespaces only: they have no other route. Hosts share the machine's
filesystem (only the network is separate). ``cut_link``/``restore_link`` take a host off the network and put
it back (its processes live on), as a pulled cable would.

Used by tests/e2e/test_multihost.py (DDP across hosts) and benchmarks/bench_chaos.py (a worker host's link cut)."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
import time

LOCK_FILE = "/tmp/sweepflow-test-netns.lock"  # held while a run picks its subnet and claims it in the root ns
SUBNETS = ipaddress.ip_network("10.213.0.0/16")


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(argv)}` failed: {proc.stderr.strip()}")
    return proc


def _routed_in_root() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address or a route in."""
    found = []
    for argv in (("-4", "-j", "addr"), ("-4", "-j", "route", "show", "table", "all")):
        for entry in json.loads(_ip(*argv).stdout or "[]"):
            for text in [
                a.get("local", "") + "/" + str(a.get("prefixlen", 32)) for a in entry.get("addr_info", [])
            ] + [entry.get("dst", "")]:
                with contextlib.suppress(ValueError):
                    if text and text not in ("default", "/32"):
                        found.append(ipaddress.ip_network(text, strict=False))
    return found


class Hosts:
    """The namespaces, veths and bridge of one test run, and every process started in them.

    Names carry this process's pid and a random suffix, so parallel runs (pytest-xdist, two engineers) never
    collide; the subnet is one no interface or route of the root namespace touches, picked and claimed under a
    lock. ``close`` kills every process started here (by pid, and whatever else is inside the namespaces) and
    removes every namespace and veth, checking they are gone."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.hosts = hosts
        self.tag = f"{os.getpid():x}{secrets.token_hex(2)}"
        self.bridge = f"sweepflow-{self.tag}-bridge"
        self.namespaces = {host: f"sweepflow-{self.tag}-{host}" for host in hosts}
        self.root_veth = f"sf{self.tag}"[:15]  # IFNAMSIZ: 15 characters
        self.made: list[str] = []  # namespaces created, in order
        self.processes: list[subprocess.Popen] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self.addresses: dict[str, str] = {}

    def __enter__(self) -> Hosts:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        _ip("netns", "add", self.bridge)
        self.made.append(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, once the root has its address
            used = _routed_in_root()
            self.subnet = next(
                (
                    net
                    for net in SUBNETS.subnets(new_prefix=24)
                    if net.network_address.packed[2] >= 10 and not any(net.overlaps(u) for u in used)
                ),
                None,
            )
            if self.subnet is None:
                raise RuntimeError(
                    f"every /24 of {SUBNETS} is in use in the root namespace; remove stale ones"
                )
            hosts = list(self.subnet.hosts())
            self.addresses = {
                "root": str(hosts[0]),
                **{h: str(hosts[i + 1]) for i, h in enumerate(self.hosts)},
            }
            _ip("link", "add", self.root_veth, "type", "veth", "peer", "name", "root", "netns", self.bridge)
            _ip("addr", "add", f"{self.addresses['root']}/24", "dev", self.root_veth)
            _ip("link", "set", self.root_veth, "up")
        _ip("-n", self.bridge, "link", "set", "root", "master", "br0")
        _ip("-n", self.bridge, "link", "set", "root", "up")
        for host, ns in self.namespaces.items():
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", self.bridge)
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.bridge, "link", "set", host, "master", "br0")
            _ip("-n", self.bridge, "link", "set", host, "up")

    def free_port(self, host: str) -> int:
        """A free port on ``host``'s address (its namespace is this run's alone: nothing else takes it)."""
        code = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])"
        argv = [
            "ip",
            "netns",
            "exec",
            self.namespaces[host],
            sys.executable,
            "-c",
            code,
            self.addresses[host],
        ]
        return int(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)

    def spawn(self, host: str, argv: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (``ip netns exec`` execs it: the pid is the command's own)."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.namespaces[host], *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes.append(proc)
        return proc

    def pids_on(self, host: str) -> list[int]:
        """Every process inside ``host``'s namespace (all started by this test)."""
        return [int(p) for p in _ip("netns", "pids", self.namespaces[host], check=False).stdout.split()]

    def cut_link(self, host: str) -> None:
        """Take ``host`` off the network: its end of the link goes down (packets to and from it are dropped;
        its processes and their connections live on, as with a pulled cable)."""
        _ip("-n", self.bridge, "link", "set", host, "down")

    def restore_link(self, host: str) -> None:
        _ip("-n", self.bridge, "link", "set", host, "up")

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process on ``host``, as if it lost power (its kernel still closes their sockets)."""
        pids = self.pids_on(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        problems = []
        for ns in self.made:
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                problems.append(f"process {proc.pid} ({' '.join(proc.args[4:7])}) survived SIGKILL")
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.root_veth, check=False)  # usually gone with its peer's namespace already
        deadline = time.monotonic() + 20  # deletion may finish asynchronously
        while time.monotonic() < deadline:
            left = set(self.made) & set(_ip("netns", "list").stdout.split())
            veth = _ip("link", "show", self.root_veth, check=False).returncode == 0
            if not left and not veth:
                break
            time.sleep(0.2)
        else:
            problems.append(
                f"not removed: namespaces {sorted(left)}, root veth {self.root_veth if veth else None}"
            )
        if problems:
            raise RuntimeError("; ".join(problems))
