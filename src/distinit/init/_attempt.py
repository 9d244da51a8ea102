"""The one internal exception for a failed-but-retryable attempt, carrying what the attempt saw."""

from __future__ import annotations

from typing import Literal

from distinit._foreign import first_line

#: Why an attempt failed in a way that waiting may cure.
FailureKind = Literal[
    "refused",  # nothing listens on MASTER_PORT yet (master not up)
    "dns",  # MASTER_ADDR does not resolve (yet)
    "unreachable",  # no route to MASTER_ADDR
    "timeout",  # connects time out: packets vanish (black hole)
    "foreign",  # a non-TCPStore program listens on MASTER_PORT
    "port_busy",  # rank 0 cannot bind MASTER_PORT
    "store",  # the store connection failed or was lost
    "join",  # not every rank joined within the attempt
    "init",  # torch's init_process_group (or the check collective) failed after a complete join
]


class AttemptFailed(Exception):
    """An attempt ended without a group, for a reason that may go away; never escapes ``init_with_retry``.

    Attributes:
        kind: the failure class (see :data:`FailureKind`).
        detail: one line saying what was seen, with values.
        missing_ranks: ranks not joined when the attempt ended (join failures only).
    """

    def __init__(self, kind: FailureKind, detail: str, *, missing_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: FailureKind = kind
        self.detail = detail
        self.missing_ranks = missing_ranks


def quote(exc: BaseException) -> str:
    """A foreign error (torch, gloo, the OS) as ``Type: first line`` for an attempt's detail."""
    return f"{type(exc).__name__}: {first_line(exc, limit=200)}"
