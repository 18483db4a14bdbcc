"""Model and optimizer state in a checkpoint: full (safetensors, written by rank 0) or sharded (DCP).

State dicts are read and written through the strategy's state-dict I/O (:class:`~trainkit.engine.strategies.Strategy`),
which names keys as the user's module does under every wrapper, so the same files load into any of them:
save under DDP on 2 processes, resume on 1; save FSDP2 shards on 2, resume on 1. This module only decides
files and formats. Loading is split into *check* (keys, shapes; no side effects) and *apply*, so a
mismatching checkpoint leaves the model untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.engine.strategies.base import Strategy

from . import serialization, state_io
from .errors import CheckpointMismatchError


def _sharded_io():
    from . import sharded_io

    return sharded_io


_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def _suffix(index: int) -> str:
    return "" if index == 0 else f"_{index}"


def model_file(index: int) -> str:
    """Full weights of the ``index``-th prepared model (Accelerate's names)."""
    return f"model{_suffix(index)}.safetensors"


def sharded_model_dir(index: int) -> str:
    """Sharded weights of the ``index``-th prepared model (Accelerate's names)."""
    return f"pytorch_model_fsdp_{index}"


def optimizer_name(index: int) -> str:
    """Stem of the full optimizer files of the ``index``-th optimizer."""
    return f"optimizer{_suffix(index)}"


def sharded_optimizer_dir(index: int) -> str:
    """Sharded optimizer tensors of the ``index``-th optimizer (their structure is in ``optimizer_{index}.json``)."""
    return f"optimizer_{index}"


# -- saving --------------------------------------------------------------------------------------------
def _may_gather_later(model: nn.Module) -> bool:
    """Cheap first test (no state dict): an asynchronous save is being captured and the model has DTensors."""
    from .background_gather import is_dtensor
    from .staging import active_recorder

    return active_recorder() is not None and any(is_dtensor(parameter) for parameter in model.parameters())


def _gather_later(tensors: dict[str, torch.Tensor], path: str) -> bool:
    """While an asynchronous save is captured: record full tensors to be gathered from these shards by the
    background writer (every rank), and return True; False where it cannot (the caller gathers now)."""
    from .background_gather import GATHERED, gathers_in_background
    from .staging import active_recorder

    recorder = active_recorder()
    if recorder is None or not gathers_in_background(tensors):
        return False
    recorder.defer(GATHERED, tensors, path)
    return True


def save_model(strategy: Strategy, model: nn.Module, directory: str, index: int, sharded: bool, is_main: bool) -> None:
    """Collective: write the model's state into ``directory``."""
    if sharded:
        state = strategy.model_state_dict(model, full=False)
        _sharded_io().save_sharded(state, os.path.join(directory, sharded_model_dir(index)))
        return
    # Asynchronous: the shards are staged and the background writer gathers them (see .background_gather).
    if _may_gather_later(model) and _gather_later(strategy.model_state_dict(model, full=False),
                                                  os.path.join(directory, model_file(index))):
        return
    state = strategy.model_state_dict(model, full=True, cpu_offload=True)
    if is_main:
        state_io.save_tensors(state, os.path.join(directory, model_file(index)))


def save_optimizer(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, directory: str, index: int,
                   sharded: bool, is_main: bool) -> None:
    """Collective: write the optimizer's state into ``directory`` (structure as JSON, tensors beside it)."""
    if not sharded and _save_optimizer_gathered_later(strategy, model, optimizer, directory, index, is_main):
        return
    state = strategy.optimizer_state_dict(model, optimizer, full=not sharded, cpu_offload=not sharded)
    if not sharded:
        if is_main:
            state_io.save_state(state, directory, optimizer_name(index))
        return
    skeleton, tensors = state_io.encode_state(state)
    if tensors:
        _sharded_io().save_sharded(tensors, os.path.join(directory, sharded_optimizer_dir(index)))
    if is_main:
        state_io.write_json({"format": "trainkit-sharded-optimizer/1", "state": skeleton},
                            os.path.join(directory, f"{sharded_optimizer_dir(index)}.json"))


def _save_optimizer_gathered_later(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer,
                                   directory: str, index: int, is_main: bool) -> bool:
    """The full optimizer files of an asynchronous save, from the shards: the JSON now (the full state's structure
    is the sharded one's), the tensors gathered by the background writer. False where that is not possible."""
    if not _may_gather_later(model):
        return False
    skeleton, tensors = state_io.encode_state(strategy.optimizer_state_dict(model, optimizer, full=False))
    name = optimizer_name(index)
    if not _gather_later(tensors, os.path.join(directory, f"{name}.safetensors")):
        return False
    if is_main:  # what state_io.save_state writes beside the tensors
        state_io.write_json(state_io.state_document(skeleton), os.path.join(directory, f"{name}.json"))
    return True


# -- loading: check, then apply ---------------------------------------------------------------------------
@dataclass
class PendingModelLoad:
    """A model's checkpoint state, checked against the model and ready to apply."""

    strategy: Strategy
    model: nn.Module
    full_state: dict[str, torch.Tensor] | None  # full checkpoint
    sharded_path: str | None  # sharded checkpoint

    def apply(self) -> None:
        """Collective: copy the state into the model."""
        if self.full_state is not None:
            self.strategy.load_model_state_dict(self.model, self.full_state, full=True)
            return
        current = self.strategy.model_state_dict(self.model, full=False)
        # Loaded into fresh tensors first: a failing read must not leave the model half-overwritten.
        loaded = {key: torch.empty_like(value) for key, value in current.items()}
        _sharded_io().load_sharded(loaded, self.sharded_path)
        self.strategy.load_model_state_dict(self.model, loaded, full=False)


def expected_model_shapes(strategy: Strategy, model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model's state, with the user's names (no communication, no copies)."""
    state = strategy.model_state_dict(model, full=False)
    return {key: tuple(value.shape) for key, value in state.items()}


def compare_keys(what: str, expected: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> None:
    """Raise :class:`CheckpointMismatchError` naming missing, unexpected and mis-shaped keys."""
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    mis_shaped = sorted(f"{key} (checkpoint {list(saved[key])}, model {list(expected[key])})"
                        for key in set(expected) & set(saved) if tuple(saved[key]) != tuple(expected[key]))
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(what, missing, unexpected, mis_shaped)


def prepare_model_load(strategy: Strategy, model: nn.Module, directory: str, index: int) -> PendingModelLoad:
    """Read and check the ``index``-th model's state from ``directory`` (full or sharded, whichever is there)."""
    expected = expected_model_shapes(strategy, model)
    full_path = os.path.join(directory, model_file(index))
    sharded_path = os.path.join(directory, sharded_model_dir(index))
    if os.path.isfile(full_path):
        state = state_io.load_tensors(full_path)
        compare_keys(f"model {index} ({model_file(index)})", expected, {k: tuple(v.shape) for k, v in state.items()})
        return PendingModelLoad(strategy, model, state, None)
    if index == 0 and os.path.isfile(os.path.join(directory, serialization.INDEX_NAME)):  # re-sharded weights
        state = serialization.load_safetensors(directory)
        compare_keys(f"model {index} ({serialization.INDEX_NAME})", expected, {k: tuple(v.shape) for k, v in state.items()})
        return PendingModelLoad(strategy, model, state, None)
    if os.path.isdir(sharded_path):
        compare_keys(f"model {index} ({sharded_model_dir(index)}/)", expected, _sharded_io().saved_tensor_shapes(sharded_path))
        return PendingModelLoad(strategy, model, None, sharded_path)
    raise CheckpointMismatchError(f"model list (no {model_file(index)} nor {sharded_model_dir(index)}/ in {directory})",
                                  [f"model {index}"], [], [])


def _parameter_names(strategy: Strategy, model: nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter (tied ones have several), as torch's state-dict API spells them."""
    names: dict[int, list[str]] = {}
    for name, parameter in strategy.unwrap_model(model).named_parameters(remove_duplicate=False):
        for prefix in _WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        names.setdefault(id(parameter), []).append(name)
    return names


@dataclass
class PendingOptimizerLoad:
    """An optimizer's checkpoint state, checked and ready to apply."""

    strategy: Strategy
    model: nn.Module
    optimizer: torch.optim.Optimizer
    state: dict[str, Any] | None  # full checkpoint: the whole state
    skeleton: Any = None  # sharded checkpoint: structure, tensors in sharded_path
    sharded_path: str | None = None

    def apply(self) -> None:
        """Collective: load the state into the optimizer."""
        state = self.state if self.state is not None else self._read_sharded()
        self.strategy.load_optimizer_state_dict(self.model, self.optimizer, state, full=self.state is not None)

    def _read_sharded(self) -> dict[str, Any]:
        wanted = set(_tensor_keys(self.skeleton))
        if not wanted:
            return state_io.decode_state(self.skeleton, {})
        # The sharded layout to read into is the optimizer's own, which exists once it has state.
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        _init_optim_state(self.optimizer)
        _, current = state_io.encode_state(self.strategy.optimizer_state_dict(self.model, self.optimizer))
        missing = sorted(wanted - set(current))
        if missing:
            raise CheckpointMismatchError("optimizer state", [], missing, [])
        # Fresh tensors, so a failing read leaves the optimizer as it was.
        loaded = {key: torch.empty_like(current[key]) for key in wanted}
        _sharded_io().load_sharded(loaded, self.sharded_path)
        return state_io.decode_state(self.skeleton, loaded)


def _tensor_keys(skeleton: Any) -> list[str]:
    keys: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if state_io.TENSOR_TAG in node:
                keys.append(node[state_io.TENSOR_TAG])
            else:
                for value in node.values():
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(skeleton)
    return keys


def _check_optimizer_params(what: str, strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer,
                            saved_groups: list[Any]) -> None:
    """The checkpoint's parameter groups must name the optimizer's parameters (compared as sets of names)."""
    names = _parameter_names(strategy, model)
    saved = [set(group.get("params", [])) for group in saved_groups]
    if len(saved) != len(optimizer.param_groups):
        raise CheckpointMismatchError(
            f"{what} (it has {len(saved)} parameter groups, the optimizer {len(optimizer.param_groups)})", [], [], [])
    flat_saved = set().union(*saved)
    # A tied parameter (GPT-2's lm_head.weight is wte.weight) has several names; the checkpoint records one.
    aliases = [names.get(id(p), [f"<unnamed {id(p)}>"]) for group in optimizer.param_groups for p in group["params"]]
    missing = sorted(alias[0] for alias in aliases if flat_saved.isdisjoint(alias))
    unexpected = sorted(flat_saved - {name for alias in aliases for name in alias})
    if missing or unexpected:
        raise CheckpointMismatchError(what, missing, unexpected, [])


def prepare_optimizer_load(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, directory: str,
                           index: int) -> PendingOptimizerLoad:
    """Read and check the ``index``-th optimizer's state from ``directory``."""
    full_name = optimizer_name(index)
    sharded_json = os.path.join(directory, f"{sharded_optimizer_dir(index)}.json")
    if os.path.isfile(os.path.join(directory, f"{full_name}.json")):
        state = state_io.load_state(directory, full_name)
        _check_optimizer_params(f"optimizer {index}", strategy, model, optimizer, state.get("param_groups", []))
        return PendingOptimizerLoad(strategy, model, optimizer, state)
    if os.path.isfile(sharded_json):
        skeleton = state_io.read_json(sharded_json)["state"]
        groups = state_io.decode_state(skeleton.get("param_groups", []), _Anything())
        _check_optimizer_params(f"optimizer {index}", strategy, model, optimizer, groups)
        return PendingOptimizerLoad(strategy, model, optimizer, None, skeleton, os.path.join(directory, sharded_optimizer_dir(index)))
    raise CheckpointMismatchError(f"optimizer list (no state for optimizer {index} in {directory})", [f"optimizer {index}"], [], [])


class _Anything(dict):
    """Stands in for the tensors when only the non-tensor structure is wanted."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> None:
        return None
