"""`trainkit config`: write a launch config (questions or --default), or --show the resolved one.

Never imports torch: answering questions and validating a file take milliseconds.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainkit.config import (
    FSDPOptions,
    LaunchConfig,
    accelerate_default_config_path,
    default_config_path,
    write_config_file,
)
from trainkit.config.engine import PRECEDENCE, resolve_engine_config

from .config_flags import FLAG_SOURCE, add_config_flags, config_layers, describe_source, flags_to_mapping
from .config_questions import Asker, ask_launch_config

HELP = "Write a launch config file (interactive, or --default), or --show the resolved configuration."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--default`, `--show`, and the config flags (`--config_file` is where to write, or what to show)."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--default", action="store_true",
                      help="Write a config without questions (defaults, plus any config flags given).")
    mode.add_argument("--show", action="store_true",
                      help="Print the resolved configuration and where each value came from.")
    add_config_flags(parser)


def run(args: argparse.Namespace) -> int:
    """Dispatch to show / default / interactive."""
    if args.show:
        return show(args)
    target = args.config_file or str(default_config_path())
    if args.default:
        flags = flags_to_mapping(args)
        config = LaunchConfig.resolve([(flags, FLAG_SOURCE)])  # MULTI_GPU or MULTI_CPU: by this machine
    else:
        answers = ask_launch_config(Asker())
        # Flags typed next to the interactive command still win over the answers.
        config = LaunchConfig.resolve([(answers, "answers"), (flags_to_mapping(args), FLAG_SOURCE)])
    path = write_config_file(config.to_dict(), target)
    print(f"trainkit config: configuration saved at {path}")
    return 0


def show(args: argparse.Namespace) -> int:
    """Print every resolved value with its source, then the unused keys."""
    layers = config_layers(args)
    config = LaunchConfig.resolve(layers)
    order = " < ".join(["defaults"] + ["flags" if source == FLAG_SOURCE else source for _, source in layers])
    print(f"Resolved launch configuration ({order}):")
    for line in format_config(config):
        print(line)
    print("Engine settings a launched script receives (explicit arguments in the script win over these: "
          f"{' > '.join(PRECEDENCE)}):")
    for line in resolve_engine_config(launch=config).describe():
        print(f"  - {line}")
    notice = config.unused_keys_notice()
    if notice:
        print(notice)
    accelerate_file = accelerate_default_config_path()
    if not default_config_path().is_file() and args.config_file is None and accelerate_file.is_file():
        print(f"note: Accelerate's default config {accelerate_file} is not read implicitly; "
              f"pass --config_file {accelerate_file} to use it.")
    return 0


def format_config(config: LaunchConfig) -> list[str]:
    """One line per key: name, value, source (fsdp_config options indented under it)."""
    lines: list[str] = []
    values = config.to_dict(full=True)
    for key, value in values.items():
        if key == "fsdp_config":
            if config.fsdp_config is None:
                lines.append(_row("fsdp_config", "(none: distributed_type is not FSDP)", ""))
                continue
            lines.append("  fsdp_config:")
            for option in FSDPOptions.field_names():
                name = f"fsdp_{option}"
                source = config.source_of(f"fsdp_config.{name}")
                lines.append(_row(name, value[name], describe_source(source, name), indent=4))
            continue
        if key == "deepspeed_config" and config.deepspeed_config is not None:
            lines.append(_row(key, "", describe_source(config.source_of(key), key)))
            lines.extend(_deepspeed_rows(config))
            continue
        lines.append(_row(key, value, describe_source(config.source_of(key), key)))
    return lines


def _deepspeed_rows(config: LaunchConfig) -> list[str]:
    """Each DeepSpeed key of the config, then the FSDP2/DDP setting it became."""
    from trainkit.config.deepspeed import AutoValues, translate

    plugin = config.deepspeed_plugin()
    if plugin is None:  # the caller shows this section only for a DeepSpeed config
        return []
    rows = [_row(name, value, "", indent=4) for name, value in (config.deepspeed_config or {}).items()]
    settings = translate(plugin.deepspeed_config, AutoValues(
        mixed_precision=config.mixed_precision, gradient_accumulation_steps=config.gradient_accumulation_steps,
        world_size=config.num_processes), where="deepspeed_config")
    rows.append("    runs on trainkit's engine as:")
    rows.extend(f"      {name:<58} -> {meaning}" for name, meaning in settings.mapping)
    if settings.no_effect:
        rows.append("      no effect under FSDP2: " + ", ".join(settings.no_effect))
    return rows


def _row(key: str, value: Any, source: str, indent: int = 2) -> str:
    shown = "null" if value is None else value
    return f"{' ' * indent}{key:<{36 - indent}} {str(shown):<28} {source}".rstrip()


if __name__ == "__main__":  # `python -m trainkit.cli.config_command`
    from .main import main

    sys.exit(main(["config", *sys.argv[1:]]))
