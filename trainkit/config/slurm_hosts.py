"""Parsing a Slurm node list: the one parser the launcher (``cli/slurm.py``) and the worker (``engine/process/state.py``) share.

The grammar (Slurm's hostlist form, as ``SLURM_JOB_NODELIST`` holds it): host expressions separated by
commas or whitespace outside brackets; each expression is literal text (letters, digits, ``.``, ``_``,
``-``) with any number of bracket groups, e.g. ``node[1-2]-ib`` or ``rack[1-2]n[01-04]``. A bracket
group is a comma list of numbers or ``lo-hi`` ranges; a range keeps the width of its lower bound
(``[001-010]`` gives ``001`` .. ``010``). Several groups in one expression form a cartesian product,
leftmost group outermost. Anything else (Blue Gene's ``[123x456]`` prisms, unbalanced brackets, odd
characters) gives None, so that callers ask ``scontrol show hostnames`` instead of guessing.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

_LITERAL = re.compile(r"[A-Za-z0-9._-]+")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_slurm_nodelist(nodelist: str) -> list[str] | None:
    """Every host of a Slurm node list, in order ("a[1-2]b[3-4]" -> a1b3, a1b4, a2b3, a2b4), or None
    when ``nodelist`` is empty or not entirely in the grammar above."""
    parsed = _parse(nodelist)
    if parsed is None:
        return None
    return [host for expression in parsed for host in _hosts(expression)]


def first_slurm_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list ("gpu[01-04,07],cpu3" -> "gpu01"; "node[1-2]-ib" -> "node1-ib").

    None for anything not fully parsed; callers fall back (``scontrol show hostnames``, or loopback).
    Only the first host is built, so a list of thousands of nodes costs nothing.
    """
    parsed = _parse(nodelist)
    if parsed is None:
        return None
    return "".join(part if isinstance(part, str) else str(part[0][0]).zfill(part[0][2]) for part in parsed[0])


# An expression is a list of parts: a literal string, or a bracket group as (low, high, width) items.
_Part = str | list[tuple[int, int, int]]


def _parse(nodelist: str) -> list[list[_Part]] | None:
    expressions: list[list[_Part]] = []
    parts: list[_Part] = []
    text = nodelist.strip()
    position = 0
    while position < len(text):
        char = text[position]
        if char in ", \t\n":
            if parts:
                expressions.append(parts)
            elif char == ",":
                return None  # an empty expression: ",a" or "a,,b"
            parts = []
            position += 1
        elif char == "[":
            end = text.find("]", position)
            if end < 0:
                return None
            group = _parse_group(text[position + 1:end])
            if group is None:
                return None
            parts.append(group)
            position = end + 1
        else:
            literal = _LITERAL.match(text, position)
            if literal is None:
                return None  # "]", a nested "[", or a character no hostname has
            parts.append(literal.group())
            position = literal.end()
    if not parts:
        return None  # empty, or a trailing comma
    expressions.append(parts)
    return expressions


def _parse_group(body: str) -> list[tuple[int, int, int]] | None:
    """``1-3,07`` -> [(1, 3, 1), (7, 7, 2)]: (low, high, width) per item; None if any item is not a number or range."""
    items = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            return None
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            return None
        items.append((low, high, len(low_text)))
    return items


def _hosts(expression: list[_Part]) -> Iterator[str]:
    choices = [[part] if isinstance(part, str) else list(_numbers(part)) for part in expression]
    return ("".join(combination) for combination in itertools.product(*choices))


def _numbers(group: list[tuple[int, int, int]]) -> Iterator[str]:
    for low, high, width in group:
        for number in range(low, high + 1):
            yield str(number).zfill(width)
