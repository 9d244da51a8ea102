"""The one place that turns a foreign error (torch, gloo, NCCL, the OS) into a line for our messages.

torch and gloo messages start with a C++ source path (``[/__w/.../pair.cc:553] ``), may span many lines
(a C++ backtrace), and may be empty. Our errors quote one bounded line of them, the same way everywhere.

Imports only the standard library (a leaf, like ``errors``).
"""

from __future__ import annotations

__all__ = ["first_line"]

#: The most characters of a foreign message quoted in one of ours.
LIMIT = 300


def first_line(source: BaseException | str, *, limit: int = LIMIT, empty: str = "no detail") -> str:
    """The first non-empty line of ``source`` (an exception or its text), without a ``[file:line] `` prefix.

    An exception with no text is named by its type (``"TimeoutError"``), so the line is never blank;
    a message with no text at all gives ``empty``.
    """
    text = str(source).strip()
    if not text and isinstance(source, BaseException):
        return type(source).__name__
    if not text:
        return empty
    line = text.splitlines()[0].strip()
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line[:limit]
