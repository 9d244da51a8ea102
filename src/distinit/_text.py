"""Turning variable text into numbers, and into bounded quotes for messages.

Every integer env reads (ranks, sizes, hostlist bounds, task counts, ports in host lists) goes
through :func:`decimal`. ``str.isdigit()`` and ``int()`` accept Unicode digits (``'²'``, ``'١'``),
signs, spaces and underscores, and ``int()`` raises ``ValueError`` beyond 4300 digits; a launcher
writes none of those, so only plain ASCII digits are numbers here.

A leaf (the standard library only): env and the hostlist grammar (:mod:`distinit._hostlist`) share it.
"""

from __future__ import annotations

import re

# [0-9], not \d: \d matches every Unicode decimal digit.
_DECIMAL = re.compile(r"[0-9]+")
#: Significant digits above which a number exceeds every range env accepts (2**64 has 20).
_MAX_DIGITS = 30
#: What :func:`decimal` returns for a longer number: larger than any bound a caller checks against.
TOO_LARGE: int = 10**_MAX_DIGITS
#: Characters of a value quoted in a message, so a 128 KB variable does not flood a log.
_QUOTE_LIMIT = 120


def decimal(text: str) -> int | None:
    """The non-negative integer ``text`` spells in ASCII digits, or ``None`` if it is anything else.

    No sign, no spaces, no Unicode digits. A number of more than 30 significant digits comes back as
    :data:`TOO_LARGE`, so the caller's range check rejects it without ``int()`` ever seeing
    thousands of digits.
    """
    if _DECIMAL.fullmatch(text) is None:
        return None
    significant = text.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return TOO_LARGE
    return int(significant or "0")


def clipped(value: str) -> str:
    """``value`` for a message without quotes (a job id), cut to about 120 characters when longer."""
    return value if len(value) <= _QUOTE_LIMIT else f"{value[:_QUOTE_LIMIT]}... ({len(value)} characters)"


def quoted(value: str) -> str:
    """``repr(value)``, cut to about 120 characters with the full length stated when longer."""
    if len(value) <= _QUOTE_LIMIT:
        return repr(value)
    return f"{value[:_QUOTE_LIMIT]!r}... ({len(value)} characters)"
