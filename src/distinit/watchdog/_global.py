"""The process-wide client and ``expires``: the call shape of ``torch.distributed.elastic.timer``."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from contextlib import AbstractContextManager
from datetime import timedelta

from distinit.watchdog._client import ENV_VAR, WatchdogClient, to_seconds

logger = logging.getLogger("distinit.watchdog")


class _State:
    """The configured client (set by an explicit call, undone by ``configure(None)``)."""

    def __init__(self) -> None:
        self.client: WatchdogClient | None = None
        self.warned = False
        self.lock = threading.Lock()


_state = _State()


def configure(client: WatchdogClient | None) -> None:
    """Make ``client`` the one :func:`expires` uses; ``None`` undoes it (torch's ``configure`` shape)."""
    with _state.lock:
        _state.client = client


def configured_client() -> WatchdogClient | None:
    """The client set by :func:`configure` (or created from ``$DISTINIT_WATCHDOG`` on first use), if any."""
    with _state.lock:
        if _state.client is None and os.environ.get(ENV_VAR):
            _state.client = WatchdogClient()
        return _state.client


def expires(
    after: float | timedelta, scope: str | None = None, client: WatchdogClient | None = None
) -> AbstractContextManager[object]:
    """Guard a block: the watchdog kills this process if it runs more than ``after`` seconds.

    Drop-in for ``torch.distributed.elastic.timer.expires``: the same arguments, a change of import. Uses
    ``client``, else the configured one, else a client for ``$DISTINIT_WATCHDOG`` created on first use.
    With none of those it fails open: the block runs unguarded and one warning is logged.

    Raises:
        TypeError: ``after`` is not a number of seconds.
        ValueError: ``after`` is not finite and positive.
    """
    seconds = to_seconds(after)
    chosen = client or configured_client()
    if chosen is None:
        if not _state.warned:
            _state.warned = True
            logger.warning(
                "watchdog expires() called with no client configured and %s unset; running unguarded",
                ENV_VAR,
                extra={"distinit": {"event": "watchdog.fail_open", "reason": "no client"}},
            )
        return contextlib.nullcontext()
    return chosen._expires_at_depth(seconds, scope, 1)
