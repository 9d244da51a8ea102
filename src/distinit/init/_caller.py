"""The caller's side of one rendezvous: run its attempts in a guarded thread, and give it up when it must.

The caller waits for the rendezvous thread until :data:`~distinit.init._handover.OVERRUN_GRACE` past the
deadline. Still blocked then: the thread is left behind and the error names what it is blocked in.
Interrupted meanwhile (Ctrl-C): the rendezvous is abandoned, its call number given back (for the peers
the call never happened), and a group that formed at that very instant is destroyed again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import torch

from distinit.errors import RendezvousTimeoutError
from distinit.init._handover import leave_behind, run_guarded
from distinit.init._session import Calls, Rendezvous

logger = logging.getLogger("distinit.init")


def run(session: Rendezvous) -> None:
    """Run ``session``'s attempts; return once the group formed, or raise what ended them."""
    device = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        device = torch.cuda.current_device()  # the CUDA current device is per thread: carry it over

    def body() -> None:
        if device is not None:
            torch.cuda.set_device(device)
        session.run_attempts()

    run_guarded(
        body,
        name=f"distinit-rendezvous-rank{session.rank}",
        deadline_at=session.deadline_at,
        handover=session.handover,
        overrun=functools.partial(_overrun, session),
        interrupted=functools.partial(_interrupted, session),
        early=session.watch.verdict,
    )


def _overrun(session: Rendezvous, thread: threading.Thread) -> RendezvousTimeoutError:
    """The thread is still blocked past the deadline: leave it behind and name what it is blocked in."""
    number, phase, blocked, lasted = session.position()
    leave_behind(thread, f"{blocked} at {session.master.name}", stuck=True)
    error = session.timeout_error(
        missing=session.log.last_missing(),
        attempts=[*session.log.lines(), f"#{number} {phase} {lasted:.1f} s: blocked, abandoned"],
        blocked=blocked,
    )
    logger.error(
        "rank %d: rendezvous at %s abandoned %.1f s past the deadline: %s",
        session.rank,
        session.master.name,
        time.monotonic() - session.deadline_at,
        blocked,
        extra={
            "distinit": {
                "event": "init.abandoned",
                "rank": session.rank,
                "attempt": number,
                "phase": phase,
                "generation": session.generation,
                "elapsed_s": round(time.monotonic() - session.start, 3),
            }
        },
    )
    return error


def _interrupted(session: Rendezvous, thread: threading.Thread, formed: bool) -> None:
    """The caller's wait was interrupted: no group may outlive that, and the call never happened."""
    if formed:
        thread.join()  # only the bookkeeping is left; then undo the group the caller will never see
        session.former.undo()
        return
    Calls.resume = True
    leave_behind(thread, f"interrupted, {session.position()[2]} at {session.master.name}", stuck=False)
