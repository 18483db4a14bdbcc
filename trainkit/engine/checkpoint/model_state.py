"""Model and optimizer state in a checkpoint: full (safetensors, written by rank 0) or sharded (DCP).

State dicts are read and written through the strategy's state-dict I/O (:class:`~trainkit.engine.strategies.Strategy`),
which names keys as the user's module does under every wrapper, so the same files load into any of them:
save under DDP on 2 processes, resume on 1; save FSDP2 shards on 2, resume on 1. This module only decides
files and formats. Loading is split into *check* (keys, shapes; no side effects) and *apply*, so a
mismatching checkpoint leaves the model untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainkit.engine.strategies.base import Strategy

from . import serialization, state_io
from .errors import CheckpointMismatchError

if TYPE_CHECKING:
    from .sinks import FileSink
    from .storage.base import CheckpointStorage


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
@dataclass(frozen=True)
class Writing:
    """How this process takes part in writing model and optimizer state."""

    sink: FileSink
    directory: str
    writes_shared: bool
    """True on the process that writes the files one process writes (rank 0; each node's first, per node)."""
    full_everywhere: bool = False
    """Full tensors are needed on every writing process (each node's own folder), not gathered to rank 0 only."""

    def path(self, name: str) -> str:
        return self.sink.storage.join(self.directory, name)


def has_dtensors(model: nn.Module) -> bool:
    """Cheap first test (no state dict): whether the model's parameters are DTensors (sharded)."""
    from .background_gather import is_dtensor

    return any(is_dtensor(parameter) for parameter in model.parameters())


def save_model(strategy: Strategy, model: nn.Module, writing: Writing, index: int, sharded: bool) -> None:
    """Collective: write the model's state."""
    if sharded:
        writing.sink.sharded(strategy.model_state_dict(model, full=False), writing.path(sharded_model_dir(index)))
        return
    # Asynchronous: the shards are staged and the background writer gathers them (see .background_gather).
    if writing.sink.defers and has_dtensors(model) and writing.sink.gathered(
            strategy.model_state_dict(model, full=False), writing.path(model_file(index))):
        return
    state = strategy.model_state_dict(model, full=True, cpu_offload=not writing.full_everywhere)
    if writing.writes_shared:
        writing.sink.tensors(state, writing.path(model_file(index)))


def save_optimizer(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, writing: Writing,
                   index: int, sharded: bool) -> None:
    """Collective: write the optimizer's state (structure as JSON, tensors beside it)."""
    if not sharded and _save_optimizer_gathered_later(strategy, model, optimizer, writing, index):
        return
    full_offload = not sharded and not writing.full_everywhere
    state = strategy.optimizer_state_dict(model, optimizer, full=not sharded, cpu_offload=full_offload)
    if not sharded:
        if writing.writes_shared:
            state_io.save_state(writing.sink, state, writing.directory, optimizer_name(index))
        return
    skeleton, tensors = state_io.encode_state(state)
    if tensors:
        writing.sink.sharded(tensors, writing.path(sharded_optimizer_dir(index)))
    if writing.writes_shared:
        state_io.write_json(writing.sink, {"format": "trainkit-sharded-optimizer/1", "state": skeleton},
                            writing.path(f"{sharded_optimizer_dir(index)}.json"))


def _save_optimizer_gathered_later(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer,
                                   writing: Writing, index: int) -> bool:
    """The full optimizer files of an asynchronous save, from the shards: the JSON now (the full state's structure
    is the sharded one's), the tensors gathered by the background writer. False where that is not possible."""
    if not (writing.sink.defers and has_dtensors(model)):
        return False
    skeleton, tensors = state_io.encode_state(strategy.optimizer_state_dict(model, optimizer, full=False))
    name = optimizer_name(index)
    if not writing.sink.gathered(tensors, writing.path(f"{name}.safetensors")):
        return False
    if writing.writes_shared:  # what state_io.save_state writes beside the tensors
        state_io.write_json(writing.sink, state_io.state_document(skeleton), writing.path(f"{name}.json"))
    return True


# -- loading: check, then apply ---------------------------------------------------------------------------
@dataclass
class PendingModelLoad:
    """A model's checkpoint state, checked against the model and ready to apply."""

    strategy: Strategy
    model: nn.Module
    full_state: dict[str, torch.Tensor] | None  # full checkpoint
    sharded_path: str | None  # sharded checkpoint
    reading: Reading | None = None

    def apply(self) -> None:
        """Collective: copy the state into the model."""
        if self.full_state is not None:
            self.strategy.load_model_state_dict(self.model, self.full_state, full=True)
            return
        assert self.reading is not None and self.sharded_path is not None
        current = self.strategy.model_state_dict(self.model, full=False)
        # Loaded into fresh tensors first: a failing read must not leave the model half-overwritten.
        loaded = {key: torch.empty_like(value) for key, value in current.items()}
        _sharded_io().load_sharded(self.reading.storage, loaded, self.sharded_path, self.reading.group)
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


@dataclass(frozen=True)
class Reading:
    """Where a checkpoint's files are read from, and the process group its sharded reads run on."""

    storage: CheckpointStorage
    directory: str
    group: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """The manifest's metadata (what wrote the checkpoint; with each node's own folder, which processes wrote which)."""

    def path(self, name: str) -> str:
        return self.storage.join(self.directory, name)


def prepare_model_load(strategy: Strategy, model: nn.Module, reading: Reading, index: int) -> PendingModelLoad:
    """Read and check the ``index``-th model's state (full or sharded, whichever is there)."""
    expected = expected_model_shapes(strategy, model)
    full_path, sharded_path = reading.path(model_file(index)), reading.path(sharded_model_dir(index))
    directory, storage = reading.directory, reading.storage
    if storage.exists(full_path):
        state = state_io.load_tensors(storage, full_path)
        compare_keys(f"model {index} ({model_file(index)})", expected, {k: tuple(v.shape) for k, v in state.items()})
        return PendingModelLoad(strategy, model, state, None, reading)
    local = storage.local_path(directory)
    if index == 0 and local is not None and storage.exists(reading.path(serialization.INDEX_NAME)):
        state = serialization.load_safetensors(local)  # weights re-sharded with an index after the save
        compare_keys(f"model {index} ({serialization.INDEX_NAME})", expected, {k: tuple(v.shape) for k, v in state.items()})
        return PendingModelLoad(strategy, model, state, None, reading)
    if storage.is_dir(sharded_path):
        shapes = _sharded_io().saved_tensor_shapes(sharded_path, storage)
        compare_keys(f"model {index} ({sharded_model_dir(index)}/)", expected, shapes)
        return PendingModelLoad(strategy, model, None, sharded_path, reading)
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
    reading: Reading | None = None

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
        assert self.reading is not None and self.sharded_path is not None
        _sharded_io().load_sharded(self.reading.storage, loaded, self.sharded_path, self.reading.group)
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


def prepare_optimizer_load(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, reading: Reading,
                           index: int) -> PendingOptimizerLoad:
    """Read and check the ``index``-th optimizer's state."""
    full_name, storage, directory = optimizer_name(index), reading.storage, reading.directory
    sharded_json = reading.path(f"{sharded_optimizer_dir(index)}.json")
    if storage.exists(reading.path(f"{full_name}.json")):
        state = state_io.load_state(storage, directory, full_name)
        _check_optimizer_params(f"optimizer {index}", strategy, model, optimizer, state.get("param_groups", []))
        return PendingOptimizerLoad(strategy, model, optimizer, state)
    if storage.exists(sharded_json):
        skeleton = state_io.read_json(storage, sharded_json)["state"]
        groups = state_io.decode_state(skeleton.get("param_groups", []), _Anything())
        _check_optimizer_params(f"optimizer {index}", strategy, model, optimizer, groups)
        return PendingOptimizerLoad(strategy, model, optimizer, None, skeleton,
                                    reading.path(sharded_optimizer_dir(index)), reading)
    raise CheckpointMismatchError(f"optimizer list (no state for optimizer {index} in {directory})", [f"optimizer {index}"], [], [])


class _Anything(dict):
    """Stands in for the tensors when only the non-tensor structure is wanted."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> None:
        return None
