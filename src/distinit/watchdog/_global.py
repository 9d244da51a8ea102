"""The process-wide client and ``expires``: the call shape of ``torch.distributed.elastic.timer``."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from contextlib import AbstractContextManager
from datetime import timedelta

from distinit._duration import to_seconds
from distinit.watchdog._client import WatchdogClient, live_client_for
from distinit.watchdog._protocol import ENV_VAR

logger = logging.getLogger("distinit.watchdog")


class _State:
    """The configured client (set by an explicit call, undone by ``configure(None)``)."""

    def __init__(self) -> None:
        self.client: WatchdogClient | None = None
        self.warned = False
        self.lock = threading.Lock()


_state = _State()


def configure(client: WatchdogClient | None) -> None:
    """Make ``client`` the one :func:`expires` uses; ``None`` undoes it (torch's ``configure`` shape).

    ``None`` also re-arms the one-time "no client" warning of :func:`expires`.
    """
    with _state.lock:
        _state.client = client
        if client is None:
            _state.warned = False


def configured_client() -> WatchdogClient | None:
    """The client set by :func:`configure`, else one for ``$DISTINIT_WATCHDOG``, if any.

    The latter is the process's open client on that directory, or one created on first use.
    """
    with _state.lock:
        path = os.environ.get(ENV_VAR)
        if _state.client is None and path:
            _state.client = live_client_for(path) or WatchdogClient(path)
        return _state.client


def expires(
    after: float | timedelta, scope: str | None = None, client: WatchdogClient | None = None
) -> AbstractContextManager[object]:
    """Guard a block: the watchdog kills this process if it runs more than ``after`` seconds.

    The call shape of ``torch.distributed.elastic.timer.expires`` (``after``, ``scope``, ``client``; see the
    compatibility table in ``docs/watchdog.md`` for what differs). Uses
    ``client``, else the configured one, else a client for ``$DISTINIT_WATCHDOG`` created on first use.
    With none of those it fails open: the block runs unguarded and one warning is logged.

    Raises:
        TypeError: ``after`` is not a number of seconds.
        ValueError: ``after`` is not finite and positive.
    """
    seconds = to_seconds(after, "after")
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
