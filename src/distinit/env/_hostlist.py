"""Slurm's compressed list grammars: hostlists (``n[01-03],m5``) and counts (``2(x3),1``).

Both are expanded exactly as ``scontrol show hostnames`` and Slurm's own task-layout variables do
(verified against Slurm 22.05.8 in the env survey, section 8): order is kept, duplicates are kept,
zero padding follows the width of a range's lower bound, several bracket groups form a cartesian
product with the leftmost group varying slowest. Invalid input raises ``MalformedEnvError`` instead
of returning garbage, which is what ignite, submitit and Lightning's parsers do.
"""

from __future__ import annotations

import itertools
import re

from distinit.errors import MalformedEnvError

#: Slurm refuses ranges longer than this (``MAX_RANGE`` in src/common/hostlist.c).
MAX_RANGE = 65536
#: Upper bound on one expression's expansion, so a hostile value cannot exhaust memory.
MAX_HOSTS = 100_000

_SEPARATORS = frozenset(", \t\n\r")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_COUNT_ITEM = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def _malformed(expr: str, problem: str, variable: str | None) -> MalformedEnvError:
    name = f"{variable}={expr!r}" if variable else f"hostlist {expr!r}"
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


def _expand_group(body: str, expr: str, variable: str | None) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``01-03,7`` → 01 02 03 7."""
    values: list[str] = []
    for element in body.split(","):
        element = "".join(element.split())  # whitespace inside a group is dropped, not counted in the width
        if not element:
            raise _malformed(expr, f"empty element in '[{body}]'", variable)
        match = _RANGE.fullmatch(element)
        if match is None:
            raise _malformed(expr, f"{element!r} in '[{body}]' is not a number or a range 'lo-hi'", variable)
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise _malformed(expr, f"range {element!r} runs backwards", variable)
        if high - low + 1 > MAX_RANGE:
            raise _malformed(expr, f"range {element!r} has more than {MAX_RANGE} values", variable)
        width = len(low_text)
        values.extend(str(value).zfill(width) for value in range(low, high + 1))
    return values


def _expand_item(item: str, expr: str, variable: str | None) -> list[str]:
    pieces: list[list[str]] = []
    position = 0
    while position < len(item):
        opening = item.find("[", position)
        if opening < 0:
            pieces.append([item[position:]])
            break
        if opening > position:
            pieces.append([item[position:opening]])
        closing = item.index("]", opening)  # balanced: checked by _split_items
        pieces.append(_expand_group(item[opening + 1 : closing], expr, variable))
        position = closing + 1
    total = 1
    for piece in pieces:
        total *= len(piece)
        if total > MAX_HOSTS:
            raise _malformed(expr, f"it expands to more than {MAX_HOSTS} names", variable)
    return ["".join(parts) for parts in itertools.product(*pieces)]


def expand_hostlist(expr: str, *, variable: str | None = None) -> list[str]:
    """Expand a Slurm hostlist expression into host names, exactly as ``scontrol show hostnames``.

    ``"rack[1-2]-node[01-02],login"`` gives ``rack1-node01 rack1-node02 rack2-node01 rack2-node02 login``.
    Order and duplicates are kept (node order defines ``SLURM_NODEID``); zero padding follows the
    lower bound's width (``n[8-10]`` → n8 n9 n10, ``n[098-101]`` → n098 … n101); commas and whitespace
    outside brackets separate names; whitespace inside brackets is ignored. A suffix after a group
    (``n[1-2]-ib``) is accepted, as pdsh and flux do. An empty expression gives an empty list.

    Args:
        expr: the hostlist expression.
        variable: the environment variable it came from, named in errors.

    Returns:
        The host names, in order.

    Raises:
        MalformedEnvError: unbalanced or nested brackets, an empty element, a non-numeric or backwards
            range, a range over 65536 values, or more than 100000 names in all.
    """
    hosts: list[str] = []
    for item in _split_items(expr, variable):
        hosts.extend(_expand_item(item, expr, variable))
        if len(hosts) > MAX_HOSTS:
            raise _malformed(expr, f"it expands to more than {MAX_HOSTS} names", variable)
    return hosts


def expand_counts(expr: str, *, variable: str) -> list[int]:
    """Expand Slurm's per-node count list (``SLURM_STEP_TASKS_PER_NODE``): ``"2(x3),1"`` → [2, 2, 2, 1].

    Raises:
        MalformedEnvError: the value is empty or an item is not ``N`` or ``N(xM)``.
    """
    counts: list[int] = []
    items = expr.strip().split(",")
    for item in items:
        match = _COUNT_ITEM.fullmatch(item.strip())
        if match is None:
            raise MalformedEnvError(
                f"{variable}={expr!r} is not a Slurm count list: item {item!r} is not 'N' or 'N(xM)'.",
                variables=(variable,),
                why="Slurm writes per-node counts as e.g. '2(x3),1' (three nodes with 2, one with 1).",
                fix=f"check what set {variable}; it should come from srun unchanged.",
            )
        repeat = int(match.group(2) or 1)
        if repeat > MAX_HOSTS or len(counts) + repeat > MAX_HOSTS:
            raise MalformedEnvError(
                f"{variable}={expr!r} describes more than {MAX_HOSTS} nodes.",
                variables=(variable,),
                fix=f"check what set {variable}.",
            )
        counts.extend([int(match.group(1))] * repeat)
    return counts
