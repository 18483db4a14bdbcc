"""Accelerate's launcher takes every ``--some_flag`` as ``--some-flag`` too (its help lists one spelling).

trainkit's commands carry Accelerate's flags, so they take both spellings the same way: scripts and job files
written for ``accelerate launch --num-processes 2 --mixed-precision bf16`` run unchanged."""

from __future__ import annotations

import argparse


def accept_hyphen_spellings(parser: argparse.ArgumentParser) -> None:
    """Register ``--a-b`` for every ``--a_b`` option of ``parser`` that has no such spelling yet.

    The alias points at the same action, so it sets the same destination; ``--help`` keeps showing the
    spellings declared (argparse prints an action's own ``option_strings``, which are left unchanged).
    Abbreviations are turned off, as in Accelerate's parser: ``--mixed`` would match both spellings of
    ``--mixed_precision`` (argparse calls that ambiguous), and a prefix that reads as another flag is an error."""
    parser.allow_abbrev = False
    for action in parser._actions:
        for option in action.option_strings:
            if not option.startswith("--") or "_" not in option:
                continue
            hyphenated = "--" + option[2:].replace("_", "-")
            parser._option_string_actions.setdefault(hyphenated, action)
