"""`trainkit env`: versions, devices and the config, ready to paste into a bug report.

:func:`env_command` returns the report as a dict (Accelerate's Python entry point does the same); ``trainkit env``
prints it. Besides trainkit's own entries it names where the ``trainkit`` and ``accelerate`` commands are on PATH
(``Not found`` when absent): after a migration, a job file still calling ``accelerate launch`` shows up here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from shutil import which
from typing import Any

from trainkit.config import ConfigError, accelerate_default_config_path, default_config_path, read_mapping_file

from .command_parser import command_parser

HELP = "Print versions, devices and the default config (for bug reports)."
NOT_FOUND = "Not found"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`trainkit env` reports the default config file, or the one named here."""
    parser.add_argument("--config_file", default=None, help=f"Config file to report (default: {default_config_path()}).")


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit env``'s own)."""
    return command_parser("env", sys.modules[__name__], subparsers)


def _version(distribution: str) -> str:
    import importlib.metadata  # here, not at the top: `trainkit --help` builds every command's parser

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {"PyTorch accelerator": "torch not importable"}
    info = {"PyTorch accelerator": "CUDA" if torch.cuda.is_available() else "N/A",
            "CUDA available": f"{torch.cuda.is_available()} (torch built with CUDA {torch.version.cuda})"}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            info[f"GPU {index}"] = torch.cuda.get_device_name(index)
    info["torch threads"] = str(torch.get_num_threads())
    info["distributed backends"] = (f"gloo {'yes' if torch.distributed.is_gloo_available() else 'no'}, "
                                    f"nccl {'yes' if torch.distributed.is_nccl_available() else 'no'}")
    return info


def _config(path: str | None) -> dict[str, Any] | str:
    """The config file's keys, or a one-line reason (none, unreadable)."""
    file = default_config_path() if path is None else path
    if path is None and not default_config_path().is_file():
        return "none"
    try:
        return read_mapping_file(file)
    except ConfigError as error:
        return f"unreadable: {error}"


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report and return it as a dict (entry -> value; the config under ``"trainkit config"``)."""
    from trainkit.version import __accelerate_version__

    info: dict[str, Any] = {
        "trainkit version": f"{_version('trainkit')} (Accelerate API {__accelerate_version__})",
        "`trainkit` bash location": which("trainkit") or NOT_FOUND,
        "`accelerate` bash location": which("accelerate") or NOT_FOUND,
    }
    info.update({f"{name} version": _version(name) for name in ("torch", "transformers", "datasets", "accelerate",
                                                                 "safetensors")})
    info["Python version"] = f"{sys.version.split()[0]} ({sys.executable})"
    info["Platform"] = platform.platform()
    info["CPU cores available"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info.update(_devices())
    info["trainkit config"] = _config(args.config_file)
    for name, value in info.items():
        if isinstance(value, dict):
            where = args.config_file or default_config_path()
            print(f"- {name} ({where}):")
            print("\n".join(f"    {key}: {item}" for key, item in value.items()))
        else:
            print(f"- {name}: {value}")
    accelerate_file = accelerate_default_config_path()
    if accelerate_file.is_file():
        print(f"- Accelerate default config present at {accelerate_file} (not read implicitly).")
    return info


def run(args: argparse.Namespace) -> int:
    """Print the report."""
    env_command(args)
    return 0
