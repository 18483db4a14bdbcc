"""Parsing a Slurm node list: the one parser the launcher (``cli/slurm.py``) and the worker (``engine/state.py``) share."""

from __future__ import annotations

import re

_NODELIST_HEAD = re.compile(r"^([^,\[]+)(?:\[([^\]]+)\])?")


def first_slurm_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list ("gpu[01-04,07],cpu3" -> "gpu01"), or None for forms not covered.

    Covers a plain host and a prefix with a bracketed list of numbers or numeric ranges; callers fall back
    (``scontrol show hostnames``, or loopback) on None.
    """
    match = _NODELIST_HEAD.match(nodelist.strip())
    if match is None:
        return None
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first if first.isdigit() else None
