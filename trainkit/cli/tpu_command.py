"""`trainkit tpu-config`: run setup commands on every VM of a Google Cloud TPU pod, through ``gcloud``.

Accelerate's command, with its flags and config keys (``tpu_name``, ``tpu_zone``, ``commands``, ``command_file``):
the commands run in ``/usr/share`` on all workers of the pod (``gcloud compute tpus tpu-vm ssh NAME --zone ZONE
--command "...; ..." --worker all``). ``--debug`` prints the gcloud command instead of running it. trainkit itself
does not train on TPUs; this only prepares the machines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainkit.config import ConfigError, default_config_path
from trainkit.config.accelerate_files import load_config_from_file

from .command_parser import command_parser

HELP = "Run setup commands on every VM of a Google Cloud TPU pod (gcloud), as `accelerate tpu-config` does."
WORKING_DIRECTORY = "/usr/share"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Accelerate's tpu-config flags."""
    config = parser.add_argument_group("pod (default: the config file's tpu_name, tpu_zone, commands, command_file)")
    config.add_argument("--config_file", default=None, help=f"Config file (default: {default_config_path()}).")
    config.add_argument("--tpu_name", default=None, help="The TPU pod's name.")
    config.add_argument("--tpu_zone", default=None, help="The pod's zone (e.g. us-central1-a).")
    commands = parser.add_argument_group("what runs on every VM")
    commands.add_argument("--command", action="append", nargs="+", default=None,
                          help="A shell command (repeat the flag for several; they run in order).")
    commands.add_argument("--command_file", default=None, help="A file of shell commands, one a line.")
    commands.add_argument("--install_accelerate", action="store_true",
                          help="First pip-install the accelerate package on every VM.")
    commands.add_argument("--accelerate_version", default="latest",
                          help="With --install_accelerate: latest (default), dev (from GitHub) or a version number.")
    parser.add_argument("--use_alpha", action="store_true", help="Run `gcloud alpha` instead of `gcloud`.")
    parser.add_argument("--debug", action="store_true", help="Print the gcloud command instead of running it.")


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit tpu-config``'s own)."""
    return command_parser("tpu-config", sys.modules[__name__], subparsers)


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The ``gcloud`` argv for ``args``, with the config file's pod and commands where no flag gives them."""
    name, zone, commands, command_file = args.tpu_name, args.tpu_zone, _flag_commands(args.command), args.command_file
    config_path = args.config_file or (default_config_path() if default_config_path().is_file() else None)
    if config_path is not None:
        file = load_config_from_file(config_path)
        name, zone = name or getattr(file, "tpu_name", None), zone or getattr(file, "tpu_zone", None)
        if not commands and not command_file:
            commands, command_file = list(getattr(file, "commands", None) or []), getattr(file, "command_file", None)
    if command_file:
        commands = Path(command_file).read_text(encoding="utf-8").splitlines()
    if not commands:
        raise ConfigError("trainkit tpu-config needs something to run: --command, --command_file, or the config "
                          "file's commands / command_file.")
    if not name or not zone:
        raise ConfigError("trainkit tpu-config needs the pod: --tpu_name and --tpu_zone (or the config file's "
                          "tpu_name and tpu_zone).")
    steps = [f"cd {WORKING_DIRECTORY}"]
    if args.install_accelerate:
        steps.append(f"pip install {_accelerate_requirement(args.accelerate_version)}")
    gcloud = ["gcloud"] + (["alpha"] if args.use_alpha else [])
    return gcloud + ["compute", "tpus", "tpu-vm", "ssh", name, "--zone", zone,
                     "--command", "; ".join(steps + commands), "--worker", "all"]


def _flag_commands(given: list[list[str]] | None) -> list[str]:
    """``--command a --command b c`` -> ``["a", "b", "c"]`` (each flag may carry several words)."""
    return [command for group in given or [] for command in group]


def _accelerate_requirement(version: str) -> str:
    if version == "latest":
        return "accelerate -U"
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    return f"accelerate=={version}"


def run(args: argparse.Namespace) -> int:
    """Run (or with --debug print) the gcloud command; returns gcloud's exit status."""
    command = gcloud_command(args)
    if args.debug:
        print("Running " + " ".join(command))
        return 0
    status = subprocess.run(command).returncode
    print("trainkit tpu-config: " + ("done on every VM." if status == 0 else f"gcloud exited {status}."))
    return status


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Accelerate's name for this command's entry point: :func:`run`, raising when gcloud fails."""
    status = run(args)
    if status:
        raise subprocess.CalledProcessError(status, "gcloud")
