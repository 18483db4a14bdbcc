"""Which flags the user typed, whatever their defaults.

Accelerate's launcher flags have defaults (``--multi_gpu`` reads False, ``--fsdp_sync_module_states`` "true") and
code written against ``accelerate launch``'s parser reads them. trainkit's resolution needs the other fact: only
flags the user typed form the top layer over the config file. Each recorded action notes its destination in the
namespace's ``typed_flags`` set when argparse calls it, which happens exactly when the option appears on the command
line, so both facts hold at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

TYPED = "typed_flags"
"""The namespace attribute: the set of destinations whose option was typed."""


_RECORDING: dict[type[argparse.Action], type[argparse.Action]] = {}


def _recording(action_class: type[argparse.Action]) -> type[argparse.Action]:
    """``action_class`` with a ``__call__`` that also notes the destination (one subclass per class)."""
    if action_class in _RECORDING:
        return _RECORDING[action_class]
    def __call__(self: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        action_class.__call__(self, parser, namespace, values, option_string)
        setattr(namespace, TYPED, frozenset(getattr(namespace, TYPED, None) or ()) | {self.dest})

    _RECORDING[action_class] = type(f"Typed{action_class.__name__}", (action_class,), {"__call__": __call__})
    return _RECORDING[action_class]


def record_typed_flags(parser: argparse.ArgumentParser, actions: Iterable[argparse.Action]) -> None:
    """Make each of ``actions`` (options of ``parser``, not positionals) note its destination when typed."""
    parser.set_defaults(**{TYPED: frozenset()})
    for action in actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            action.__class__ = _recording(type(action))


def was_typed(args: argparse.Namespace, dest: str, default: Any = None) -> bool:
    """Whether ``dest`` was typed: from the record when ``args`` came from a recording parser; otherwise (a
    namespace built by hand) when its value is set and differs from ``default``."""
    typed = getattr(args, TYPED, None)
    if typed is not None:
        return dest in typed
    value = getattr(args, dest, None)
    return value is not None and value != default
