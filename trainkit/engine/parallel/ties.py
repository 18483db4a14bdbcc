"""Tied parameters (one tensor under two names): found before a model is moved or sharded, re-tied after
(``Module.to("meta")`` and re-materialising give each name its own tensor). Used by FSDP2 and tensor
parallelism."""

from __future__ import annotations

from torch import nn


def parameter_ties(model: nn.Module) -> dict[str, str]:
    """``{name: first name}`` for every parameter reachable under a second name (tied weights)."""
    first: dict[int, str] = {}
    ties = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            ties[name] = first[id(param)]
        else:
            first[id(param)] = name
    return ties


def restore_parameter_ties(model: nn.Module, ties: dict[str, str]) -> None:
    """Point each tied name at its first name's parameter again (``Module.to("meta")`` unties them)."""
    for name, source in ties.items():
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, attribute, model.get_parameter(source))
