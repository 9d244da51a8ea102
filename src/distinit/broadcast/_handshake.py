"""The start of every call: exchange the header rows, map a failed exchange, judge, raise the verdict."""

from __future__ import annotations

from collections.abc import Callable

import torch

from distinit.broadcast import _header
from distinit.broadcast._group import CallContext
from distinit.broadcast._mismatch import Mismatch, judge
from distinit.broadcast._transport import timeout_error

Explain = Callable[[_header.Exchange, Mismatch], Mismatch | None]
"""Runs when the verdict found a difference, to replace it by a more precise one (or None: no difference).
It may run collectives of its own; their failures are mapped like the exchange's."""


def handshake(
    ctx: CallContext,
    words: list[int],
    *,
    inline: torch.Tensor | bytes | None = None,
    cause: BaseException | None = None,
    explain: Explain | None = None,
) -> _header.Exchange:
    """Exchange this rank's header row within the group and return every rank's, once all agree.

    Args:
        ctx: the call.
        words: this rank's fixed header words (:func:`distinit.broadcast._header.fixed_words`).
        inline: payload bytes riding in the row (src only).
        cause: this rank's local problem (its status word says which), chained to the error it raises.
        explain: see :data:`Explain`.

    Raises:
        BroadcastMismatchError: the verdict found a disagreement or a malformed header (on every rank).
        BroadcastTimeoutError: the exchange timed out or lost a peer (on this rank).
    """
    try:
        exchanged = _header.exchange(
            words,
            group=ctx.group,
            group_size=ctx.size,
            device=ctx.comm_device,
            inline=inline,
            wait_for=ctx.wait_for,
            scratch=ctx.scratch,
        )
        verdict = judge(exchanged.views, my_op=ctx.op, seq=ctx.seq)
        if verdict is not None and explain is not None:
            verdict = explain(exchanged, verdict)
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, "header exchange", exc) from exc
    if verdict is not None:
        raise verdict.error() from cause
    return exchanged
