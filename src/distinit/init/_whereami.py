"""Is MASTER_ADDR this host? Rank 0 checks before hosting the store, so a wrong address fails at once.

torch's store host also connects to MASTER_ADDR as a client; if MASTER_ADDR names another host, that
connect is refused (or vanishes) until the deadline, and every other rank waits on a host where no store
will ever run. So rank 0 resolves MASTER_ADDR and tries to bind each address (an address of this host
binds); if none binds, it still accepts the address when a connection to it arrives at a listener of its
own on MASTER_PORT (a NAT, a container's published port, a service address routed here).
"""

from __future__ import annotations

import socket

from distinit._net import binds
from distinit.init import _messages
from distinit.init._diagnose import Master

#: How long the routing test waits for its connection (a black-holed address costs this once).
ROUTE_TIMEOUT = 1.0


def check_hosting_addr(master: Master, infos: list[tuple[int, str]]) -> None:
    """Raise if no address of ``infos`` (``(family, ip)`` of MASTER_ADDR) is this host or routes here.

    Raises:
        MasterUnreachableError: MASTER_ADDR is not an address of this host (not retried).
    """
    if any(binds(ip) for _, ip in infos):
        return
    if any(_routes_here(family, ip, master.port) for family, ip in infos):
        return
    host = socket.gethostname()
    raise _messages.not_this_host(
        master=master.name, addr=master.addr, resolved=[ip for _, ip in infos], host=host, rank=master.rank
    )


def _routes_here(family: int, ip: str, port: int) -> bool:
    """Whether a connection to ``ip:port`` arrives at a listener of ours on ``port`` (all interfaces)."""
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            return True  # the port is busy (hosting reports it) or cannot be tested: do not guess
        listener.listen(1)
        listener.settimeout(ROUTE_TIMEOUT)
        client = socket.socket(family, socket.SOCK_STREAM)
        client.settimeout(ROUTE_TIMEOUT)
        try:
            client.connect((ip, port))
            conn, _ = listener.accept()  # through a NAT the peer address differs: arriving is what counts
        except OSError:
            return False
        finally:
            client.close()  # the client side closes first: its TIME_WAIT stays off MASTER_PORT
        conn.close()
        return True
