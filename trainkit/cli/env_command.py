"""`trainkit env`: versions, devices and the default config, ready to paste into a bug report."""

from __future__ import annotations

import argparse
import os
import platform
import sys

from trainkit.config import ConfigError, accelerate_default_config_path, default_config_path, read_mapping_file

HELP = "Print versions, devices and the default config (for bug reports)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`trainkit env` takes no options of its own."""


def _version(distribution: str) -> str:
    import importlib.metadata  # here, not at the top: `trainkit --help` builds every command's parser

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return ["torch not importable"]
    lines = [f"CUDA available: {torch.cuda.is_available()} (torch built with CUDA {torch.version.cuda})"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            lines.append(f"  cuda:{index} {torch.cuda.get_device_name(index)}")
    lines.append(f"torch threads: {torch.get_num_threads()}; distributed backends: gloo "
                 f"{'yes' if torch.distributed.is_gloo_available() else 'no'}, nccl "
                 f"{'yes' if torch.distributed.is_nccl_available() else 'no'}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the report."""
    from trainkit.version import __accelerate_version__

    print("- trainkit version:", _version("trainkit"), f"(Accelerate API {__accelerate_version__})")
    for name in ("torch", "transformers", "datasets", "accelerate", "safetensors"):
        print(f"- {name} version: {_version(name)}")
    print("- Python version:", sys.version.split()[0], f"({sys.executable})")
    print("- Platform:", platform.platform())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print("- CPU cores available:", cores)
    for line in _devices():
        print("-", line)
    path = default_config_path()
    print(f"- Default config ({path}):", "" if path.is_file() else "none")
    if path.is_file():
        try:
            for key, value in read_mapping_file(path).items():
                print(f"    {key}: {value}")
        except ConfigError as error:
            print(f"    unreadable: {error}")
    accelerate_file = accelerate_default_config_path()
    if accelerate_file.is_file():
        print(f"- Accelerate default config present at {accelerate_file} (not read implicitly).")
    return 0
