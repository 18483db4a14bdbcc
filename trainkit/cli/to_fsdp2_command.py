"""`trainkit to-fsdp2`: rewrite a config file's FSDP1 ``fsdp_config`` into FSDP2's keys (``fsdp_version: 2``).

trainkit runs FSDP2 from either form; the rewrite is for a file that ``accelerate launch`` must read as FSDP2 too
(the table: ``trainkit.config.fsdp2_file``). The input is never changed unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainkit.config import ConfigError, read_mapping_file, write_config_file
from trainkit.config.fsdp2_file import convert_config_to_fsdp2

from .command_parser import command_parser

HELP = "Rewrite a config file's FSDP1 fsdp_config into FSDP2's keys (fsdp_version: 2), as `accelerate to-fsdp2`."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The file to read, and where to write (a new file, or the same one with --overwrite)."""
    parser.add_argument("--config_file", required=True, help="The config file to convert.")
    parser.add_argument("--output_file", default=None, help="Where to write the converted config.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace --output_file if it exists; without --output_file, rewrite --config_file itself.")


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit to-fsdp2``'s own)."""
    return command_parser("to-fsdp2", sys.modules[__name__], subparsers)


def load_config(config_file: str) -> dict[str, Any]:
    """The config file's mapping; an empty file is an error (there is nothing to convert)."""
    config = read_mapping_file(config_file)
    if not config:
        raise ConfigError(f"Config file {config_file!r} is empty: nothing to convert.")
    return config


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert ``args.config_file`` and write the result (checks first, so nothing is written on a refusal)."""
    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file!r} not found.")
    if args.output_file is None and not args.overwrite:
        raise ConfigError("Name the result: --output_file PATH, or --overwrite to rewrite the config file itself.")
    output = args.output_file or args.config_file
    if args.output_file is not None and not args.overwrite and Path(output).exists():
        raise FileExistsError(f"Output file {output!r} already exists; pass --overwrite to replace it.")
    write_config_file(convert_config_to_fsdp2(load_config(args.config_file)), output)


def run(args: argparse.Namespace) -> int:
    """``trainkit to-fsdp2``: convert, say where the result is."""
    try:
        to_fsdp2_command(args)
    except (FileNotFoundError, FileExistsError) as error:
        print(f"trainkit to-fsdp2: error: {error}", file=sys.stderr)
        return 2
    print(f"trainkit to-fsdp2: wrote {args.output_file or args.config_file}")
    return 0
