"""Which network interface a rank's gloo or NCCL connections use: the one holding its Dask worker's address.

Left to themselves, gloo binds the address its host's name resolves to (127.0.0.1 on many machines, through
/etc/hosts, or an address on another network) and NCCL the first interface that is up (docker0, a management
NIC). Within one host that works; across hosts a rank then offers its peers an address they cannot reach, and
the group fails at start-up or hangs in its first collective. The Dask worker's own address is one the other
hosts do reach (the scheduler and the other workers talk to it), so the interface holding it is the one to use.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping

import psutil

log = logging.getLogger(__name__)

#: The variable each backend reads for its interface, and how its value names exactly one interface (NCCL
#: takes a bare name as a prefix: "eth1" would also match "eth10"; "=eth1" is that interface only).
_IFNAME_VARIABLES = {"gloo": ("GLOO_SOCKET_IFNAME", "{}"), "nccl": ("NCCL_SOCKET_IFNAME", "={}")}


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """``host`` as IP addresses: itself when it is one, else what its name resolves to (none if it does not)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def interface_holding(host: str) -> str | None:
    """The name of this host's network interface that holds ``host`` (an IP address, or a name resolving to
    one of this host's addresses), e.g. ``"lo"`` for ``127.0.0.1``; None when no interface holds it."""
    wanted = _addresses(host)
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                ip = ipaddress.ip_address(address.address.split("%", 1)[0])  # fe80::1%eth0: drop the scope
            except ValueError:
                continue
            if ip in wanted:
                return name
    return None


def socket_interface_env(backend: str, host: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that make ``backend`` (``gloo``, ``nccl``, or both as in ``cpu:gloo,cuda:nccl``) connect
    through the interface holding ``host``, this rank's Dask worker address: set them before the process group
    is created (gloo reads its variable then, NCCL when it first starts).

    A variable already set in ``environ`` is left as it is: whoever set it for the workers knows their network,
    and the Dask address is not always where gradients should go (Dask on a management network, collectives on
    InfiniBand or a faster NIC). When no interface holds ``host``, nothing is set and a warning says what to do.
    """
    wanted = {
        variable: template
        for name, (variable, template) in _IFNAME_VARIABLES.items()
        if name in backend and not environ.get(variable)
    }
    if not wanted:
        return {}
    interface = interface_holding(host)
    if interface is None:
        log.warning(
            "no network interface of this host holds its Dask worker's address %s, so %s picks one by itself "
            "(from the host name), which the other hosts may not reach; set %s for the Dask workers to the "
            "interface their peers reach them on",
            host,
            backend,
            " / ".join(wanted),
        )
        return {}
    return {variable: template.format(interface) for variable, template in wanted.items()}
