"""The start of every call: agree on the header (rows, or a digest in large groups), judge, raise the verdict."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from distinit.broadcast import _digest, _header
from distinit.broadcast._group import CallContext
from distinit.broadcast._mismatch import Mismatch, judge, timeout_error

logger = logging.getLogger("distinit.broadcast")

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
    """Agree on the call within the group and return every rank's view of it, once all agree.

    Groups below :func:`distinit.broadcast._digest.digest_from` ranks exchange header rows (every
    rank's row to every rank). Larger ones reduce one fixed digest; only when it shows a difference do
    they exchange the rows, once, so the verdict (and the error text) is the row path's.

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
    verdict: Mismatch | None = None
    try:
        exchanged = _agreed_by_digest(ctx, words, inline) if ctx.digest else None
        if exchanged is None:
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


def _agreed_by_digest(
    ctx: CallContext, words: list[int], inline: torch.Tensor | bytes | None
) -> _header.Exchange | None:
    """The digest path: the exchange when every rank agrees, None when the rows must be compared."""
    exchanged = _digest.agree(
        words,
        rank=ctx.rank,
        group=ctx.group,
        group_size=ctx.size,
        device=ctx.comm_device,
        inline=inline,
        wait_for=ctx.wait_for,
    )
    if exchanged is None:
        logger.debug(
            "rank %d: %s call #%d: the header digest differs across the %d ranks; comparing their rows",
            ctx.rank,
            ctx.call,
            ctx.seq,
            ctx.size,
            extra=ctx.log_facts(event="broadcast.digest_differs"),
        )
    return exchanged
