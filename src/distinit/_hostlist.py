"""Slurm's compressed list grammars: hostlists (``n[01-03],m5``) and counts (``2(x3),1``).

Both are expanded as ``scontrol show hostnames`` and Slurm's task-layout variables do (checked
against scontrol of Slurm 22.05.8): order and duplicates are kept, zero padding follows the width
of a range's lower bound *as written* (whitespace included: ``n[ 1-3]`` gives n01 n02 n03), and
several bracket groups form a cartesian product in Slurm's order (see :func:`_slurm_order`).
Invalid input raises ``MalformedEnvError`` instead of returning garbage, which is what ignite,
submitit and Lightning's parsers do. The deviations from scontrol are listed in docs/env.md.

The size of an expansion is counted from the ranges before any name is built, so a few kilobytes
of ``n[0-65535,0-65535,...]`` fail at once instead of building millions of names.

A leaf (the standard library, ``errors`` and the leaf ``_text``): env reads Slurm's variables with it, and the
Lightning integration's placement check reads Slurm's per-node counts with :func:`expand_counts`.
:func:`expand_hostlist` is public as ``distinit.expand_hostlist``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from distinit._text import decimal, quoted
from distinit.errors import MalformedEnvError

#: Slurm refuses ranges longer than this (``MAX_RANGE`` in src/common/hostlist.c).
MAX_RANGE = 65536
#: Upper bound on one expression's expansion, so a hostile value cannot exhaust memory.
MAX_HOSTS = 100_000
#: Longest name an expansion may produce: a DNS name has at most 253 characters.
MAX_NAME = 255
#: Slurm keeps range bounds in an unsigned long.
_MAX_BOUND = 2**64 - 1
#: Tasks on one node: torch keeps sizes in C ints.
_MAX_COUNT = 2**31 - 1

_SEPARATORS = frozenset(", \t\n\r")
# C's isspace(): strtoul() skips these before a bound, and Slurm counts them in the width.
_RANGE = re.compile(r"([ \t\n\v\f\r]*([0-9]+)[ \t\n\v\f\r]*)-[ \t\n\v\f\r]*([0-9]+)|[ \t\n\v\f\r]*([0-9]+)")
_COUNT_ITEM = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


@dataclass(frozen=True)
class _Range:
    """One ``lo-hi`` element of a bracket group; values are zero-padded to ``width``."""

    low: int
    high: int
    width: int

    @property
    def count(self) -> int:
        return self.high - self.low + 1

    @property
    def longest(self) -> int:
        """Characters of the longest value."""
        return max(self.width, len(str(self.high)))


def _malformed(expr: str, problem: str, variable: str | None) -> MalformedEnvError:
    name = f"{variable}={quoted(expr)}" if variable else f"hostlist {quoted(expr)}"
    return MalformedEnvError(
        f"{name} is not a valid Slurm hostlist: {problem}.",
        variables=(variable,) if variable else (),
        why="hostlists look like 'node[01-04,07],gpu[1-2]-ib': ranges 'lo-hi' with lo <= hi inside brackets, "
        "no nesting, no empty elements.",
        fix="check the value the scheduler or your job script set; `scontrol show hostnames '<expr>'` shows "
        "what Slurm makes of it.",
    )


def _split_items(expr: str, variable: str | None) -> list[str]:
    """Split on separators outside brackets; empty items are skipped, as Slurm does."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in expr:
        if char == "[":
            depth += 1
            if depth > 1:
                raise _malformed(expr, "nested '['", variable)
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _malformed(expr, "']' without a matching '['", variable)
        if depth == 0 and char in _SEPARATORS:
            if current:
                items.append("".join(current))
                current = []
            continue
        current.append(char)
    if depth != 0:
        raise _malformed(expr, "'[' is never closed", variable)
    if current:
        items.append("".join(current))
    return items


def _parse_range(element: str, body: str, expr: str, variable: str | None) -> _Range:
    """One element of a group: ``7``, ``01-03``; the width is the lower bound's text, spaces included."""
    match = _RANGE.fullmatch(element)
    if match is None:
        shown = quoted(element) if element else "an empty element"
        raise _malformed(expr, f"{shown} in '[{body[:60]}]' is not a number or a range 'lo-hi'", variable)
    low_text, low_digits, high_digits, single = match.groups()
    low = decimal(low_digits if single is None else single)
    high = low if high_digits is None else decimal(high_digits)
    if low is None or high is None or high > _MAX_BOUND:
        raise _malformed(expr, f"{quoted(element)} has a bound above {_MAX_BOUND}", variable)
    if high < low:
        raise _malformed(expr, f"range {quoted(element)} runs backwards", variable)
    if high - low + 1 > MAX_RANGE:
        raise _malformed(expr, f"range {quoted(element)} has more than {MAX_RANGE} values", variable)
    return _Range(low=low, high=high, width=len(element if single is not None else low_text))


def _parse_group(body: str, expr: str, variable: str | None) -> list[_Range]:
    """The ranges of one bracket group, counted (not expanded) against the cap."""
    ranges: list[_Range] = []
    count = 0
    for element in body.split(","):
        if not element:
            raise _malformed(expr, f"empty element in '[{body[:60]}]'", variable)
        ranges.append(_parse_range(element, body, expr, variable))
        count += ranges[-1].count
        if count > MAX_HOSTS:
            raise _malformed(expr, f"it expands to more than {MAX_HOSTS} names", variable)
    return ranges


def _pieces(item: str, expr: str, variable: str | None) -> list[str | list[_Range]]:
    """``n[1-2]-ib`` → ['n', [1-2], '-ib']: literal text and parsed groups, in order."""
    pieces: list[str | list[_Range]] = []
    position = 0
    while position < len(item):
        opening = item.find("[", position)
        if opening < 0:
            pieces.append(item[position:])
            break
        if opening > position:
            pieces.append(item[position:opening])
        closing = item.index("]", opening)  # balanced: checked by _split_items
        pieces.append(_parse_group(item[opening + 1 : closing], expr, variable))
        position = closing + 1
    return pieces


def _slurm_order(groups: int) -> list[int]:
    """Group indexes from the slowest-varying to the fastest, as Slurm's hostlist.c iterates them.

    The last group varies fastest; the others vary from the first (faster) to the second-to-last
    (slowest): ``a[1-2]b[1-2]c[1-2]`` → a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ... With two groups
    this is the plain cartesian product, leftmost slowest.
    """
    if groups < 2:
        return list(range(groups))
    return [*range(groups - 2, -1, -1), groups - 1]


def _values(ranges: list[_Range]) -> list[str]:
    return [str(value).zfill(r.width) for r in ranges for value in range(r.low, r.high + 1)]


def _expand_item(item: str, expr: str, variable: str | None, *, room: int) -> list[str]:
    """The names of one item, after checking their number (at most ``room``) and length first."""
    pieces = _pieces(item, expr, variable)
    groups = [piece for piece in pieces if isinstance(piece, list)]
    total = 1
    for ranges in groups:
        total *= sum(r.count for r in ranges)
        if total > room:
            raise _malformed(expr, f"it expands to more than {MAX_HOSTS} names", variable)
    longest = sum(len(p) if isinstance(p, str) else max(r.longest for r in p) for p in pieces)
    if longest > MAX_NAME:
        raise _malformed(expr, f"a name would be {longest} characters long (at most {MAX_NAME})", variable)
    if not groups:
        return [item]
    order = _slurm_order(len(groups))
    slots = [index for index, piece in enumerate(pieces) if isinstance(piece, list)]
    template = [piece if isinstance(piece, str) else "" for piece in pieces]
    names = []
    for combination in itertools.product(*(_values(groups[g]) for g in order)):
        for g, value in zip(order, combination, strict=True):
            template[slots[g]] = value
        names.append("".join(template))
    return names


def expand_hostlist(expr: str, *, variable: str | None = None) -> list[str]:
    """Expand a Slurm hostlist expression into host names, as ``scontrol show hostnames`` does.

    ``"rack[1-2]-node[01-02],login"`` gives ``rack1-node01 rack1-node02 rack2-node01 rack2-node02 login``.
    Order and duplicates are kept (node order defines ``SLURM_NODEID``); zero padding follows the
    lower bound's width as written (``n[8-10]`` → n8 n9 n10, ``n[098-101]`` → n098 … n101, and
    ``n[ 1-3]`` → n01 n02 n03 because the space counts); commas and whitespace outside brackets
    separate names. Three or more groups vary in Slurm's order: the last fastest, then the first,
    the second, ..., the second-to-last slowest. A suffix after the last group (``n[1-2]-ib``) is
    accepted, as pdsh and flux do. An empty expression gives an empty list.

    Args:
        expr: the hostlist expression.
        variable: the environment variable it came from, named in errors.

    Returns:
        The host names, in order.

    Raises:
        MalformedEnvError: unbalanced or nested brackets, an empty element, a non-numeric or backwards
            range, a range over 65536 values, more than 100000 names in all, or a name over 255
            characters. The size is checked before any name is built.
    """
    hosts: list[str] = []
    for item in _split_items(expr, variable):
        hosts.extend(_expand_item(item, expr, variable, room=MAX_HOSTS - len(hosts)))
        if len(hosts) > MAX_HOSTS:
            raise _malformed(expr, f"it expands to more than {MAX_HOSTS} names", variable)
    return hosts


def expand_counts(expr: str, *, variable: str) -> list[int]:
    """Expand Slurm's per-node count list (``SLURM_STEP_TASKS_PER_NODE``): ``"2(x3),1"`` → [2, 2, 2, 1].

    Raises:
        MalformedEnvError: the value is empty, an item is not ``N`` or ``N(xM)``, a count is above
            2**31-1, or the list describes more than 100000 nodes.
    """
    counts: list[int] = []
    for item in expr.strip().split(","):
        match = _COUNT_ITEM.fullmatch(item.strip())
        if match is None:
            raise MalformedEnvError(
                f"{variable}={quoted(expr)} is not a Slurm count list: item {quoted(item)} is not 'N' or 'N(xM)'.",
                variables=(variable,),
                why="Slurm writes per-node counts as e.g. '2(x3),1' (three nodes with 2, one with 1).",
                fix=f"check what set {variable}; it should come from srun unchanged.",
            )
        count, repeat = decimal(match.group(1)), decimal(match.group(2) or "1")
        if count is None or repeat is None or count > _MAX_COUNT or len(counts) + repeat > MAX_HOSTS:
            raise MalformedEnvError(
                f"{variable}={quoted(expr)} describes more than {MAX_HOSTS} nodes or more than {_MAX_COUNT} "
                "tasks on one node.",
                variables=(variable,),
                fix=f"check what set {variable}.",
            )
        counts.extend([count] * repeat)
    return counts
