"""Name the cause of a failure that persisted: the specific error, with the port's holder looked up."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from distinit._net import port_holder
from distinit.errors import RendezvousError
from distinit.init import _messages
from distinit.init._attempt import AttemptFailed

#: Failure kinds whose persistence has a specific error (the others end as ``RendezvousTimeoutError``).
SPECIFIC = ("dns", "unreachable", "timeout", "foreign", "port_busy")


@dataclass(frozen=True)
class Master:
    """The rendezvous endpoint as this rank sees it, and the rank (for the messages)."""

    addr: str
    port: int
    rank: int

    @property
    def name(self) -> str:
        """``addr:port``."""
        return f"{self.addr}:{self.port}"

    def is_local(self) -> bool:
        """Whether the master is this host (only then can the port's holder be looked up)."""
        return self.addr in ("127.0.0.1", "localhost", socket.gethostname())


def specific_error(failure: AttemptFailed, lasted: float, master: Master) -> RendezvousError:
    """The error for ``failure`` (one of :data:`SPECIFIC`) having lasted ``lasted`` seconds."""
    detail = failure.detail.split(": ", 1)[-1]
    if failure.kind == "dns":
        return _messages.cannot_resolve(
            master=master.name, host=master.addr, seconds=lasted, detail=detail, rank=master.rank
        )
    if failure.kind == "unreachable":
        return _messages.unroutable(master=master.name, seconds=lasted, detail=detail, rank=master.rank)
    if failure.kind == "timeout":
        return _messages.black_hole(master=master.name, seconds=lasted, rank=master.rank)
    if failure.kind == "port_busy":
        holder = port_holder(master.port)
        return _messages.port_in_use(
            master=master.name, port=master.port, seconds=lasted, holder=holder, rank=master.rank
        )
    holder = port_holder(master.port) if master.is_local() else None
    return _messages.foreign_listener(master=master.name, seconds=lasted, holder=holder, rank=master.rank)
