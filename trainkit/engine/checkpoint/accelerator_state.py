"""What ``Accelerator.save_state`` writes and ``load_state`` reads: everything a run needs to continue exactly.

Layout (names follow Accelerate where it has one)::

    checkpoint_N/
      model.safetensors | pytorch_model_fsdp_0/     weights: full (rank 0) or DCP shards (FSDP2)
      optimizer.json + optimizer.safetensors         full optimizer state, by parameter name
      | optimizer_0.json + optimizer_0/              sharded: structure as JSON, tensors as DCP shards
      scheduler.json, scaler.json, dataloaders.json  JSON (+ safetensors when they hold tensors)
      custom_checkpoint_0.json ...                   objects passed to register_for_checkpointing
      random_states_{rank}.json                      every generator of every rank
      accelerator_state.json                         step, iteration, world size, what is inside
      manifest.json                                  written last: sizes and SHA-256 of every file

Loading reads and checks everything against the prepared objects, and only then applies it, so a damaged or
mismatching checkpoint leaves the run untouched. Where fewer objects are prepared than were saved (an evaluation
script that prepares only the model), what is prepared is loaded and one line names the rest, as Accelerate does;
``require_all_objects=True`` refuses instead. The orchestration (which storage, which folder, verification) is the
:class:`~.checkpointer.Checkpointer`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainkit.engine.accelerator_parts.attributes import run_load_state_pre_hooks
from trainkit.engine.data import PreparedDataLoader

from . import model_state, state_io
from .model_state import Writing
from .errors import CheckpointMismatchError
from .global_batch import BatchShape, Rescale, keep_global_batch, saved_batch_shape
from .rng import capture_rng_state, restore_rng_state

if TYPE_CHECKING:  # the Accelerator as this module sees it: a Protocol (the Accelerator imports this package)
    from trainkit.engine.accelerator_parts.prepared import PreparedObjects

    from .model_state import Reading
    from .protocol import CheckpointedAccelerator as Accelerator

logger = logging.getLogger(__name__)

STATE_FILE = "accelerator_state.json"
STATE_FORMAT = "trainkit-accelerator-state/1"


def wants_sharded(accelerator: Accelerator, model: Any, sharded: bool | None) -> bool:
    """Whether ``model`` (and its optimizers) is written as DCP shards."""
    return accelerator.strategy.checkpoint_is_sharded(model) if sharded is None else sharded


def needs_every_process(accelerator: Accelerator, sharded: bool | None = None,
                        dataloaders: Sequence[PreparedDataLoader] | None = None) -> str | None:
    """Why writing the state needs every process (a collective), or None when the main process alone can:
    sharded or distributed parameters, a streamed loader whose position gathers every reader."""
    prepared = accelerator.prepared
    for index, model in enumerate(prepared.models):
        if wants_sharded(accelerator, model, sharded) or model_state.has_dtensors(model):
            return f"model {index} is sharded over the processes"
    for index, loader in enumerate(_tracked_loaders(prepared, dataloaders)):
        if getattr(loader, "is_stream", False):
            return f"dataloader {index} streams its dataset: its position gathers every process's readers"
    return None


def _owning_model(prepared: PreparedObjects, index: int) -> Any:
    owner = prepared.model_owning(prepared.optimizers[index].optimizer)
    if owner is None:
        raise ValueError(f"Optimizer {index} holds parameters of no prepared model; prepare its model too.")
    return owner


def _tracked_loaders(prepared: PreparedObjects, dataloaders: Sequence[PreparedDataLoader] | None) -> list[PreparedDataLoader]:
    """The loaders whose positions a checkpoint holds: those given, else every prepared one."""
    return list(prepared.dataloaders) if dataloaders is None else list(dataloaders)


def _scheduler_name(index: int) -> str:
    return f"scheduler{'' if index == 0 else f'_{index}'}"


def write_state_files(accelerator: Accelerator, writing: Writing | str, sharded: bool | None = None,
                      dataloaders: Sequence[PreparedDataLoader] | None = None) -> None:
    """Collective: write the accelerator's whole state into a checkpoint being written (``StagedCheckpoint.writing()``),
    or into an existing, empty local folder every process shares (not atomic by itself, for code that runs its own
    ``atomic_checkpoint``).

    ``sharded``: True writes DCP shards, False full tensors on rank 0; None lets the strategy decide per
    model (sharded for FSDP2 unless the plugin says ``FULL_STATE_DICT``). ``dataloaders``: the prepared loaders
    whose positions to store (default: all; the Trainer passes its training loader only, since an
    evaluation loader's position means nothing and how many exist depends on when the checkpoint is taken).
    """
    if isinstance(writing, str):
        from .sinks import WriteNow
        from .storage.shared_folder import SharedFolderStorage

        writing = Writing(WriteNow(SharedFolderStorage()), writing, accelerator.is_main_process)
    strategy, prepared = accelerator.strategy, accelerator.prepared
    loaders = _tracked_loaders(prepared, dataloaders)
    layout: dict[str, Any] = {"models": [], "optimizers": []}
    for index, model in enumerate(prepared.models):
        use_sharded = wants_sharded(accelerator, model, sharded)
        model_state.save_model(strategy, model, writing, index, use_sharded)
        layout["models"].append("sharded" if use_sharded else "full")
    for index, optimizer in enumerate(prepared.optimizers):
        owner = _owning_model(prepared, index)
        use_sharded = wants_sharded(accelerator, owner, sharded)
        model_state.save_optimizer(strategy, owner, optimizer.optimizer, writing, index, use_sharded)
        layout["optimizers"].append("sharded" if use_sharded else "full")
    # Every rank asks: a streamed loader's position gathers all ranks' readers (a collective).
    loader_states = [loader.state_dict() for loader in loaders]
    if writing.writes_shared:
        _write_shared_files(accelerator, writing, loader_states, layout)
    # Per process: the generators, and the tracked loaders' draws of the pass in progress (replayed on resume).
    rng_state = {**capture_rng_state(), "dataloaders": [loader.random_state() for loader in loaders]}
    state_io.write_json(writing.sink, rng_state, writing.path(f"random_states_{accelerator.process_index}.json"))


def _write_shared_files(accelerator: Accelerator, writing: Writing, loader_states: list[Any],
                        layout: dict[str, Any]) -> None:
    prepared, sink, folder = accelerator.prepared, writing.sink, writing.directory
    for index, scheduler in enumerate(prepared.schedulers):
        state_io.save_state(sink, scheduler.state_dict(), folder, _scheduler_name(index))
    state_io.save_state(sink, loader_states, folder, "dataloaders")
    state_io.save_state(sink, accelerator.precision.state_dict(), folder, "scaler")
    for index, obj in enumerate(prepared.custom_objects):
        state_io.save_state(sink, obj.state_dict(), folder, f"custom_checkpoint_{index}")
    state_io.write_json(sink, {
        "format": STATE_FORMAT,
        "step": accelerator.step,
        "iteration": accelerator.project_configuration.iteration,
        "world_size": accelerator.num_processes,
        "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
        "scheduler_steps_per_call": [scheduler.steps_per_call for scheduler in prepared.schedulers],
        "counts": {"schedulers": len(prepared.schedulers), "dataloaders": len(loader_states),
                   "custom_objects": len(prepared.custom_objects)},
        **layout,
    }, writing.path(STATE_FILE))


# -- loading ------------------------------------------------------------------------------------------------------
@dataclass
class _Counts:
    """How many objects of each kind the checkpoint holds and this run has prepared."""

    saved: dict[str, int]
    prepared: dict[str, int]

    def not_prepared(self) -> list[str]:
        """Saved objects that have no prepared counterpart ("optimizer 0", ...)."""
        return [f"{kind} {index}" for kind, count in self.saved.items() for index in range(self.prepared[kind], count)]

    def check(self, require_all: bool) -> None:
        for kind, saved in self.saved.items():
            current = self.prepared[kind]
            if current > saved or (require_all and current != saved):
                raise CheckpointMismatchError(f"number of {kind}s (checkpoint {saved}, prepared now {current})", [], [], [])


def _counts(info: dict[str, Any], prepared: PreparedObjects, loaders: list[PreparedDataLoader]) -> _Counts:
    counts = info["counts"]
    saved = {"model": len(info["models"]), "optimizer": len(info["optimizers"]), "scheduler": counts["schedulers"],
             "dataloader": counts["dataloaders"], "registered object": counts["custom_objects"]}
    current = {"model": len(prepared.models), "optimizer": len(prepared.optimizers),
               "scheduler": len(prepared.schedulers), "dataloader": len(loaders),
               "registered object": len(prepared.custom_objects)}
    return _Counts(saved, current)


def read_state_info(reading: Reading) -> dict[str, Any]:
    """``accelerator_state.json``, checked to be one trainkit wrote."""
    info = state_io.read_json(reading.storage, reading.path(STATE_FILE))
    if info.get("format") != STATE_FORMAT:
        raise CheckpointMismatchError(f"format ({info.get('format')!r}, expected {STATE_FORMAT!r})", [], [], [])
    return info


def load_state_files(accelerator: Accelerator, reading: Reading, folder: str, *, require_all_objects: bool = False,
                     dataloaders: Sequence[PreparedDataLoader] | None = None, keep_global_batch: bool = True,
                     load_models: bool = True) -> None:
    """Collective: check the verified checkpoint ``reading`` against the prepared objects, then load it
    (``load_models=False``: all but the models' weights, which the caller loads itself, as the Trainer's
    ``_load_from_checkpoint`` hook does)."""
    info = read_state_info(reading)
    prepared = accelerator.prepared
    tracked_loaders = _tracked_loaders(prepared, dataloaders)
    counts = _counts(info, prepared, tracked_loaders)
    counts.check(require_all_objects)
    run_load_state_pre_hooks(accelerator, prepared.models, reading.directory)
    loaded = _read_everything(accelerator, reading, info, tracked_loaders, keep_global_batch, load_models)
    _apply(accelerator, loaded, tracked_loaders, info)
    if accelerator.is_main_process:
        left = counts.not_prepared()
        logger.info("Loaded checkpoint %s", folder)
        if left:
            logger.warning("load_state(%s): not loaded, as this run has not prepared them: %s (pass "
                           "require_all_objects=True to refuse such a checkpoint instead).", folder, ", ".join(left))


def _read_everything(accelerator: Accelerator, reading: Reading, info: dict[str, Any],
                     loaders: list[PreparedDataLoader], keep_batch: bool, load_models: bool) -> dict[str, Any]:
    """Read and check everything first (nothing is applied yet)."""
    strategy, prepared, storage, directory = accelerator.strategy, accelerator.prepared, reading.storage, reading.directory
    pending: list[Any] = [model_state.prepare_model_load(strategy, model, reading, i)
                          for i, model in enumerate(prepared.models) if load_models]
    for index, optimizer in enumerate(prepared.optimizers):
        pending.append(model_state.prepare_optimizer_load(strategy, _owning_model(prepared, index),
                                                          optimizer.optimizer, reading, index))
    saved_loaders = state_io.load_state(storage, directory, "dataloaders")
    return {
        "pending": pending,
        "schedulers": [state_io.load_state(storage, directory, _scheduler_name(i)) for i in range(len(prepared.schedulers))],
        "loaders": saved_loaders[:len(loaders)],
        "scaler": state_io.read_optional(storage, directory, "scaler"),
        "customs": [state_io.load_state(storage, directory, f"custom_checkpoint_{i}")
                    for i in range(len(prepared.custom_objects))],
        "rng": _read_rng(reading, accelerator.process_index, int(info["world_size"])),
        "rescale": _global_batch_rescale(accelerator, reading, loaders) if keep_batch and loaders else None,
    }


def _apply(accelerator: Accelerator, loaded: dict[str, Any], loaders: list[PreparedDataLoader],
           info: dict[str, Any]) -> None:
    prepared = accelerator.prepared
    for item in loaded["pending"]:
        item.apply()
    for scheduler, state in zip(prepared.schedulers, loaded["schedulers"]):
        scheduler.load_state_dict(state)
    same_processes = int(info["world_size"]) == accelerator.num_processes
    _load_loaders(loaders, loaded["loaders"], loaded["rng"].get("dataloaders") if same_processes else None)
    if loaded["scaler"]:
        accelerator.precision.load_state_dict(loaded["scaler"])
    for obj, state in zip(prepared.custom_objects, loaded["customs"]):
        obj.load_state_dict(state)
    if loaded["rescale"] is not None:
        _apply_rescale(accelerator, loaded["rescale"], info.get("scheduler_steps_per_call"))
    accelerator.step = int(info.get("step", 0))
    if accelerator.project_configuration.automatic_checkpoint_naming:
        accelerator.project_configuration.iteration = int(info.get("iteration", 0)) + 1
    restore_rng_state(loaded["rng"], accelerator.device)  # last: nothing after it may draw random numbers


def _load_loaders(loaders: Sequence[PreparedDataLoader], states: list[Any], passes: list[Any] | None) -> None:
    """Each loader's position, and this process's draws of its pass in progress (``passes``: None when the checkpoint
    comes from another number of processes, whose ranks read other batches)."""
    for index, (loader, state) in enumerate(zip(loaders, states)):
        loader.load_state_dict(state)
        loader.load_random_state(passes[index] if passes and index < len(passes) else None)


def _global_batch_rescale(accelerator: Accelerator, reading: Reading,
                          loaders: Sequence[PreparedDataLoader]) -> Rescale | None:
    """The accumulation that keeps the checkpoint's global batch here (None: nothing to change), refused early."""
    saved = saved_batch_shape(reading.storage, reading.directory)
    if saved is None:
        return None
    current = BatchShape(accelerator.num_processes, loaders[0].global_batch_size, accelerator.gradient_accumulation_steps)
    return keep_global_batch(saved, current, reading.directory)


def rescale_accumulation(accelerator: Accelerator, saved: BatchShape, loader_global_batch: int | None, folder: str,
                         scheduler_steps: list[int] | None = None) -> None:
    """The accumulation that keeps ``saved``'s global batch on this world size becomes the run's (nothing on the
    same world size or an unknown batch; refused where it does not divide)."""
    current = BatchShape(accelerator.num_processes, loader_global_batch, accelerator.gradient_accumulation_steps)
    rescale = keep_global_batch(saved, current, folder)
    if rescale is not None:
        _apply_rescale(accelerator, rescale, scheduler_steps)


def _apply_rescale(accelerator: Accelerator, rescale: Rescale, scheduler_steps: list[int] | None) -> None:
    """Use the rescaled accumulation (with its provenance), and step the schedulers as often per optimizer step as
    the saved run did, so the learning-rate schedule continues too; say what changed."""
    previous = accelerator.gradient_accumulation_steps
    accelerator.gradient_accumulation_steps = rescale.accumulation
    accelerator.config = accelerator.config.replace(rescale.source, gradient_accumulation_steps=rescale.accumulation)
    for scheduler, steps in zip(accelerator.prepared.schedulers, scheduler_steps or []):
        scheduler.steps_per_call = int(steps)
    if accelerator.is_main_process:
        logger.warning("trainkit: %s", rescale.describe(previous, accelerator.num_processes))


def saved_random_states(storage: Any, directory: str) -> list[int]:
    """The ranks whose random states the checkpoint holds."""
    names = storage.list_names(directory)
    return sorted(int(name[len("random_states_"):-len(".json")]) for name in names
                  if name.startswith("random_states_") and name.endswith(".json"))


def _read_rng(reading: Reading, rank: int, saved_world: int) -> dict[str, Any]:
    own = reading.path(f"random_states_{rank}.json")
    if reading.storage.exists(own):
        return state_io.read_json(reading.storage, own)
    present = saved_random_states(reading.storage, reading.directory)
    if not present:
        raise CheckpointMismatchError(f"random states (no random_states_*.json in {reading.directory})", [], [], [])
    source = rank % saved_world if rank % saved_world in present else present[0]
    why = (f"saved on {saved_world} processes" if rank >= saved_world
           else "saved by fewer processes than ran (save_state called on the main process only)")
    logger.warning("Checkpoint %s: rank %d takes the random states of rank %d (%s).", reading.directory, rank, source, why)
    return state_io.read_json(reading.storage, reading.path(f"random_states_{source}.json"))
