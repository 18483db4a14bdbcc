"""The `trainkit` entry point: dispatches to one small module per command.

A command module defines ``HELP`` (one line; ``DESCRIPTION`` for a longer ``--help`` text),
``add_arguments(parser)`` and ``run(args) -> int``, and must not import torch at module level (``trainkit --help`` stays fast). Adding a command is one line
in :data:`COMMANDS`; a listed module that does not exist yet is simply not offered.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from .command_parser import command_parser

COMMANDS: dict[str, str] = {
    "config": "trainkit.cli.config_command",
    "launch": "trainkit.cli.launch_command",
    "env": "trainkit.cli.env_command",
    "merge-weights": "trainkit.cli.merge_weights",
    "test": "trainkit.cli.test_command",
    "to-fsdp2": "trainkit.cli.to_fsdp2_command",
    "tpu-config": "trainkit.cli.tpu_command",
    "estimate-memory": "trainkit.cli.estimate_command",
}


def _load_command(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:  # the slot is reserved but nobody filled it yet
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    """The full parser with one sub-parser per available command."""
    parser = argparse.ArgumentParser(
        prog="trainkit",
        description="trainkit command line: write a config, launch a script on N processes, report the environment.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for name, module_name in COMMANDS.items():
        module = _load_command(module_name)
        if module is None:
            continue
        command_parser(name, module, subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named in ``argv`` (default: ``sys.argv[1:]``) and return its exit status."""
    from trainkit.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    module = getattr(args, "_command_module", None)
    if module is None:
        parser.print_help()
        return 2
    try:
        return int(module.run(args) or 0)
    except ConfigError as error:
        print(f"trainkit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
