"""Run one check under its own bound: a check that runs out, or raises, is a ``fail`` that says why."""

from __future__ import annotations

import threading
from collections.abc import Callable

from distinit._duration import wait_bound
from distinit._foreign import first_line
from distinit.doctor._model import Check


def bounded(check_id: str, probe: Callable[[], Check], *, timeout: float, waiting_for: str) -> Check:
    """``probe()`` run in a daemon thread for at most ``timeout`` seconds.

    A probe stuck in a native call (a DNS lookup, a connect) cannot be interrupted; its thread is left
    behind as a daemon and the check reports ``fail`` naming ``waiting_for``.
    """
    box: list[Check] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(probe())
        except Exception as exc:  # any bug or OS error in one check must not stop the others
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"distinit-doctor-{check_id}", daemon=True)
    thread.start()
    thread.join(wait_bound(timeout))
    if box:
        return box[0]
    if errors:
        exc = errors[0]
        return Check(
            id=check_id,
            status="fail",
            summary=f"the check itself failed: {type(exc).__name__}: {first_line(exc)}",
            fix="report this as a distinit bug, with the output of `distinit env --explain`",
        )
    return Check(
        id=check_id,
        status="fail",
        summary=f"no answer within {timeout:.1f} s while waiting for {waiting_for}",
        fix=f"find out why {waiting_for} hangs on this host, or raise --timeout",
        evidence={"timeout_s": timeout, "waiting_for": waiting_for},
    )
