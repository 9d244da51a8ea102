"""The public boundary: the caller sees the distinit error alone, a few lines, not a chain of tracebacks.

Inside, errors are raised ``from`` what caused them (an internal attempt failure, a torch or OS error),
and they cross a thread and the retry loop, so their tracebacks hold dozens of frames nobody needs. At
``setup()``/``init_with_retry()`` the error is raised again without its traceback and ``from None``; the
foreign cause stays available as ``exc.cause`` and the whole chain is logged at DEBUG.
"""

from __future__ import annotations

import logging

from distinit.errors import DistinitError
from distinit.init._attempt import AttemptFailed

logger = logging.getLogger("distinit.init")


def readable(exc: DistinitError) -> DistinitError:
    """``exc`` ready to be raised ``from None`` at a public function (see the module docstring)."""
    if exc.cause is None:
        exc.cause = foreign_cause(exc)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("the error below in full, with what caused it", exc_info=exc)
    return exc.with_traceback(None)


def foreign_cause(exc: BaseException) -> BaseException | None:
    """The first exception in ``exc``'s chain that is neither a distinit error nor an attempt failure."""
    seen: set[int] = set()
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not isinstance(current, (DistinitError, AttemptFailed)):
            return current
        current = current.__cause__ or current.__context__
    return None
