"""`trainkit test`: launch trainkit's bundled self-check (``trainkit.cli.self_check``) with a config, as
``accelerate test`` launches Accelerate's: the same ``trainkit launch`` a training script gets, so a config that
passes here starts training the same way."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from trainkit.config import default_config_path

from .command_parser import command_parser

HELP = "Launch trainkit's self-check on the configured processes: does distributed training work with this config?"
SELF_CHECK_MODULE = "trainkit.cli.self_check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The config to check (default: the default config file, or one process without one)."""
    parser.add_argument("--config_file", default=None, help=f"Config file to launch with (default: {default_config_path()}).")


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit test``'s own)."""
    return command_parser("test", sys.modules[__name__], subparsers)


def self_check_command(args: argparse.Namespace) -> list[str]:
    """The ``trainkit launch`` command line that runs the self-check."""
    config = ["--config_file", args.config_file] if args.config_file else []
    return [sys.executable, "-m", "trainkit.cli.main", "launch", *config, "-m", SELF_CHECK_MODULE]


def run(args: argparse.Namespace) -> int:
    """Launch the self-check; its exit status (0: every check passed)."""
    return subprocess.run(self_check_command(args)).returncode


def test_command(args: argparse.Namespace) -> None:
    """Accelerate's name for the entry point: :func:`run`, raising when a check fails."""
    status = run(args)
    if status:
        raise subprocess.CalledProcessError(status, self_check_command(args))
