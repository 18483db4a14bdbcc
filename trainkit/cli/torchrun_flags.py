"""torchrun's spellings on `trainkit launch`: ``--nnodes 2 --nproc_per_node 8`` means what Accelerate's names mean.

The option strings come from the installed torchrun's own parser (``torch.distributed.run.get_args_parser``), so
both of its spellings (``--nproc-per-node`` / ``--nproc_per_node``) are accepted exactly where that torch accepts
them. They are read from that function's source (its ``add_argument`` calls) rather than by importing torch, so
that building `trainkit launch`'s parser stays torch-free (the one-process path ``exec``s the script without
importing torch); a test compares the result with the parser itself on every declared stack. Each torchrun option maps onto the launch setting with the same meaning (:data:`SETTINGS`); ``trainkit
launch`` reads it as a layer just above its own flags, labelled with the spelling the user typed (``flag
--nnodes``), so errors and ``trainkit config --show``-style provenance name it. The same setting given under both
spellings with different values is an error naming both. torchrun options that trainkit decides itself, or cannot
act on, are refused by name with the reason, instead of argparse's "unrecognized arguments".
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from trainkit.config import ConfigError

DEST_PREFIX = "torchrun_"
_REGISTERED: dict[str, tuple[str, ...]] = {}  # dest -> the option strings registered for it (those trainkit lacks)
SOURCE_PREFIX = "flag "

SETTINGS = {
    "nnodes": "num_machines",
    "nproc_per_node": "num_processes",  # per machine: times the machine count (Accelerate counts all processes)
    "node_rank": "machine_rank",
    "master_addr": "main_process_ip",
    "master_port": "main_process_port",
    "rdzv_backend": "rdzv_backend",
    "rdzv_endpoint": "main_process_ip",  # host[:port]: the address and the port
    "rdzv_id": "rdzv_id",
    "rdzv_conf": "rdzv_conf",
    "max_restarts": "max_restarts",
    "monitor_interval": "monitor_interval",
    "standalone": "num_machines",  # one machine, a local rendezvous (trainkit's way on one machine)
}
"""torchrun's option (its ``dest``) -> the launch setting it sets."""
ARGUMENTS = {"log_dir": "log_dir", "tee": "tee", "module": "module"}
"""torchrun options that are ``trainkit launch`` arguments of its own (not config keys)."""
REFUSED = {
    "signals_to_handle": "trainkit decides it from --preemption_signals",
    "shutdown_timeout": "trainkit decides it from --preemption_grace_period",
    "no_python": "trainkit launch runs Python scripts and modules (-m) only",
    "run_path": "trainkit launch runs the script itself; pass its path",
}
"""torchrun options with a reason of their own; any other option the installed torchrun has and this module does
not map is refused with the list of the accepted ones."""


@functools.lru_cache(maxsize=1)
def torchrun_actions() -> tuple[tuple[str, tuple[str, ...], bool], ...]:
    """``(dest, option strings, takes a value)`` for every option of the installed torchrun's parser, read from
    ``get_args_parser``'s ``add_argument`` calls in ``torch/distributed/run.py`` without importing torch."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ()
    source = Path(next(iter(spec.submodule_search_locations)), "distributed", "run.py")
    if not source.is_file():
        return ()
    tree = ast.parse(source.read_text(encoding="utf-8"))
    function = next((node for node in ast.walk(tree)
                     if isinstance(node, ast.FunctionDef) and node.name == "get_args_parser"), None)
    found = []
    for call in ast.walk(function) if function is not None else ():
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        options = tuple(str(arg.value) for arg in call.args
                        if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"))
        if not options:
            continue
        keywords = {keyword.arg: keyword.value for keyword in call.keywords}
        dest = keywords.get("dest")
        name = dest.value if isinstance(dest, ast.Constant) else _argparse_dest(options)
        action = keywords.get("action")
        # argparse's flag actions, and torchrun's own check_env (a store_true that reads PET_<NAME>)
        flag = (isinstance(action, ast.Name) and action.id == "check_env") or \
            (isinstance(action, ast.Constant) and action.value in ("store_true", "store_false", "store_const"))
        found.append((str(name), options, not flag))
    return tuple(found)


def _argparse_dest(options: tuple[str, ...]) -> str:
    """argparse's dest: the first long option without its dashes, inner dashes as underscores."""
    long = next((option for option in options if option.startswith("--")), options[0])
    return long.lstrip("-").replace("-", "_")


def add_torchrun_flags(parser: argparse.ArgumentParser) -> None:
    """Register torchrun's spellings that ``parser`` does not already have (an identical option string is already
    the same setting under Accelerate's name, e.g. ``--max_restarts``). A torchrun spelling that is only the hyphen
    form of such a flag (``--max-restarts``) is accepted but not listed in the help, as no hyphen spelling is."""
    taken = {option for action in parser._actions for option in action.option_strings}
    hyphen_forms = {"--" + option[2:].replace("_", "-") for option in taken if option.startswith("--")}
    _REGISTERED.clear()
    group = parser.add_argument_group(
        "torchrun's spellings", "Each sets the setting named in its help; torchrun's other options are refused "
        "with the reason (trainkit decides them, or cannot act on them).")
    for dest, options, takes_value in torchrun_actions():
        free = [option for option in options if option not in taken]
        if not free:
            continue
        _REGISTERED[dest] = tuple(free)
        target = SETTINGS.get(dest) or ARGUMENTS.get(dest)
        text = f"torchrun's spelling of --{target}." if target else argparse.SUPPRESS
        if set(free) <= hyphen_forms:
            text = argparse.SUPPRESS
        elif dest == "standalone":
            text = "torchrun's one-machine job (a local rendezvous): --num_machines 1."
        elif dest == "nproc_per_node":
            text = "torchrun's processes per machine (an integer, auto, cpu or gpu): num_processes = nnodes x this."
        elif dest == "rdzv_endpoint":
            text = "torchrun's host[:port] of the rendezvous: --main_process_ip and --main_process_port."
        if takes_value:
            group.add_argument(*free, dest=DEST_PREFIX + dest, default=None, metavar="VALUE", help=text)
        else:
            group.add_argument(*free, dest=DEST_PREFIX + dest, action="store_const", const=True, default=None, help=text)


def _refusal(dest: str) -> str:
    if dest in REFUSED:
        return f"not taken ({REFUSED[dest]})"
    accepted = ", ".join(sorted(set(SETTINGS) | set(ARGUMENTS)))
    return f"not taken by trainkit launch (its torchrun options: {accepted})"


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The torchrun spellings the user typed: dest -> value."""
    return {name[len(DEST_PREFIX):]: value for name, value in vars(args).items()
            if name.startswith(DEST_PREFIX) and value is not None}


def spelling(dest: str) -> str:
    """The spelling shown for a torchrun option: one registered for it (the underscore form where both are,
    ``--nproc_per_node``; ``--max-restarts`` where trainkit's own flag is ``--max_restarts``)."""
    options = _REGISTERED.get(dest) or (f"--{dest}",)
    return next((option for option in options if "_" in option), options[-1])


def torchrun_layers(args: argparse.Namespace, below: list[tuple[dict[str, Any], str]]) -> list[tuple[dict[str, Any], str]]:
    """One ``(mapping, "flag --<torchrun option>")`` layer per torchrun spelling typed, to sit above ``below`` (the
    other layers, lowest first, Accelerate's flags last); ``args``' own arguments (``--log_dir``...) are filled in.

    Raises :class:`ConfigError` for a refused option, or for a setting that Accelerate's spelling sets otherwise.
    """
    typed = given(args)
    flags = below[-1][0] if below else {}
    layers: list[tuple[dict[str, Any], str]] = []
    for dest, value in typed.items():
        source = SOURCE_PREFIX + spelling(dest)
        if dest in ARGUMENTS:
            _set_argument(args, ARGUMENTS[dest], value, source)
            continue
        if dest not in SETTINGS:
            raise ConfigError(f"{spelling(dest)} is torchrun's option; {_refusal(dest)}.")
        mapping = _mapping(dest, value, typed, below)
        for key, setting in mapping.items():
            if key in flags and str(flags[key]) != str(setting):
                raise ConfigError(f"{spelling(dest)} {value} sets {key} to {setting}, but --{key} {flags[key]} says "
                                  f"{flags[key]}: give one of the two spellings.")
        for layer, layer_source in layers:
            for key in set(layer) & set(mapping):
                if str(layer[key]) != str(mapping[key]):
                    raise ConfigError(f"{layer_source[len(SOURCE_PREFIX):]} sets {key} to {layer[key]}, but "
                                      f"{spelling(dest)} sets it to {mapping[key]}: give one of the two.")
        layers.append((mapping, source))
    return layers


def _mapping(dest: str, value: Any, typed: dict[str, Any], below: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
    if dest == "standalone":
        return {"num_machines": 1}
    if dest == "rdzv_endpoint":
        host, _, port = str(value).rpartition(":") if ":" in str(value) else (str(value), "", "")
        return {"main_process_ip": host, **({"main_process_port": port} if port else {})}
    if dest == "nproc_per_node":
        from .torchrun_env import local_world_size

        return {"num_processes": local_world_size(str(value)) * _machines(typed, below)}
    return {SETTINGS[dest]: value}


def _machines(typed: dict[str, Any], below: list[tuple[dict[str, Any], str]]) -> int:
    """The machine count ``--nproc_per_node`` multiplies: ``--nnodes`` (its MAX), else the highest layer's
    ``num_machines``, else 1 (torchrun's default)."""
    nnodes = typed.get("nnodes") or next((layer["num_machines"] for layer, _ in reversed(below)
                                          if layer.get("num_machines") is not None), 1)
    try:
        return int(str(nnodes).rpartition(":")[2])
    except ValueError:
        return 1  # the launch config reports the bad num_machines value, naming it


def _set_argument(args: argparse.Namespace, name: str, value: Any, source: str) -> None:
    current = getattr(args, name, None)
    if current not in (None, False) and str(current) != str(value):
        raise ConfigError(f"{source[len(SOURCE_PREFIX):]} {value} and --{name} {current}: give one of the two spellings.")
    setattr(args, name, value)
