"""``Accelerator.save_state`` / ``load_state``: everything a run needs to continue exactly, in one atomic folder.

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

Loading verifies the manifest, reads and checks everything against the prepared objects, and only
then applies it, so a damaged or mismatching checkpoint leaves the run untouched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainkit.engine.api.attributes import run_load_state_pre_hooks, run_save_state_pre_hooks
from trainkit.engine.data import PreparedDataLoader

from . import model_state, state_io
from .async_writer import background_writer, flush_background_writes
from .errors import CheckpointMismatchError
from .global_batch import BatchShape, Rescale, keep_global_batch, saved_batch_shape
from .resume_folder import ACCELERATOR_CONVENTION, elastic_reason, find_resume_folder
from .rng import capture_rng_state, restore_rng_state
from .saving import save_checkpoint_folder
from .storage import checkpoint_io_of

if TYPE_CHECKING:  # the Accelerator as this module sees it: a Protocol (the Accelerator imports this package)
    from .protocol import CheckpointedAccelerator as Accelerator
    from trainkit.engine.api.prepared import PreparedObjects

logger = logging.getLogger(__name__)

STATE_FILE = "accelerator_state.json"
STATE_FORMAT = "trainkit-accelerator-state/1"
AUTOMATIC_PREFIX = ACCELERATOR_CONVENTION.prefix
CHECKPOINTS_SUBDIR = ACCELERATOR_CONVENTION.subfolder


def _project_dir(accelerator: Accelerator, action: str) -> str:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise ValueError(f"{action} with automatic_checkpoint_naming needs a project_dir (Accelerator(project_dir=...)).")
    return project_dir


def _wants_sharded(accelerator: Accelerator, model: Any, sharded: bool | None) -> bool:
    return accelerator.strategy.checkpoint_is_sharded(model) if sharded is None else sharded


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


def write_state_files(accelerator: Accelerator, directory: str, sharded: bool | None = None,
                      dataloaders: Sequence[PreparedDataLoader] | None = None) -> None:
    """Collective: write the accelerator's whole state into the existing, empty ``directory`` (not atomic by itself).

    ``sharded``: True writes DCP shards, False full tensors on rank 0; None lets the strategy decide per
    model (sharded for FSDP2 unless the plugin says ``FULL_STATE_DICT``). ``dataloaders``: the prepared loaders
    whose positions to store (default: all; the Trainer passes its training loader only, since an
    evaluation loader's position means nothing and how many exist depends on when the checkpoint is taken).
    """
    main, strategy, prepared = accelerator.is_main_process, accelerator.strategy, accelerator.prepared
    loaders = _tracked_loaders(prepared, dataloaders)
    layout: dict[str, Any] = {"models": [], "optimizers": []}
    for index, model in enumerate(prepared.models):
        use_sharded = _wants_sharded(accelerator, model, sharded)
        model_state.save_model(strategy, model, directory, index, use_sharded, main)
        layout["models"].append("sharded" if use_sharded else "full")
    for index, optimizer in enumerate(prepared.optimizers):
        owner = _owning_model(prepared, index)
        use_sharded = _wants_sharded(accelerator, owner, sharded)
        model_state.save_optimizer(strategy, owner, optimizer.optimizer, directory, index, use_sharded, main)
        layout["optimizers"].append("sharded" if use_sharded else "full")
    # Every rank asks: a streamed loader's position gathers all ranks' readers (a collective).
    loader_states = [loader.state_dict() for loader in loaders]
    if main:
        for index, scheduler in enumerate(prepared.schedulers):
            state_io.save_state(scheduler.state_dict(), directory, _scheduler_name(index))
        state_io.save_state(loader_states, directory, "dataloaders")
        state_io.save_state(accelerator.precision.state_dict(), directory, "scaler")
        for index, obj in enumerate(prepared.custom_objects):
            state_io.save_state(obj.state_dict(), directory, f"custom_checkpoint_{index}")
        state_io.write_json({
            "format": STATE_FORMAT,
            "step": accelerator.step,
            "iteration": accelerator.project_configuration.iteration,
            "world_size": accelerator.num_processes,
            "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
            "scheduler_steps_per_call": [scheduler.steps_per_call for scheduler in prepared.schedulers],
            "counts": {"schedulers": len(prepared.schedulers), "dataloaders": len(loaders),
                       "custom_objects": len(prepared.custom_objects)},
            **layout,
        }, os.path.join(directory, STATE_FILE))
    # Per process: the generators, and the tracked loaders' draws of the pass in progress (replayed on resume).
    rng_state = {**capture_rng_state(), "dataloaders": [loader.random_state() for loader in loaders]}
    state_io.write_json(rng_state, os.path.join(directory, f"random_states_{accelerator.process_index}.json"))


def save_accelerator_state(accelerator: Accelerator, output_dir: str | os.PathLike | None = None, *,
                           sharded: bool | None = None, dataloaders: Sequence[PreparedDataLoader] | None = None,
                           synchronous: bool = False, **_ignored: Any) -> str | None:
    """Collective: write a complete, atomic checkpoint and return its folder.

    An explicit ``output_dir`` that holds a complete checkpoint is replaced atomically (an empty one is
    fine; any other existing folder is refused). With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
    ``project_dir/checkpoints/checkpoint_{iteration}``; afterwards the iteration advances and the oldest
    complete checkpoints beyond ``total_limit`` are deleted (never the newest nor the one resumed from).
    With ``ProjectConfiguration(async_save=True)`` the folder appears once the background writer has
    committed it (see :mod:`.async_writer`); ``synchronous=True`` writes it before returning anyway. Returns
    None when the save was skipped (``async_save_when_busy="skip"`` with a save still in flight).
    """
    config = accelerator.project_configuration
    automatic = config.automatic_checkpoint_naming
    if automatic:
        output_dir = os.path.join(_project_dir(accelerator, "save_state"), CHECKPOINTS_SUBDIR,
                                  f"{AUTOMATIC_PREFIX}{config.iteration}")
    elif output_dir is None:
        raise ValueError("save_state needs an output_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
    final_dir = os.path.normpath(os.fspath(output_dir))
    io = checkpoint_io_of(accelerator)
    protected = accelerator.loaded_checkpoint  # read now: the rotation may run later, on the writer's thread

    def write_files(staging: str) -> None:
        run_save_state_pre_hooks(accelerator, accelerator.prepared.models, staging)
        write_state_files(accelerator, staging, sharded, dataloaders)

    def rotate(folder: str) -> None:
        if automatic and accelerator.is_main_process and config.total_limit:
            io.rotate(os.path.dirname(folder), config.total_limit, protected=[protected], prefix=AUTOMATIC_PREFIX)

    # An explicit folder may be saved to again (a common Accelerate habit): the new checkpoint replaces
    # the old one by renames, never by writing into it. Automatically named folders are never replaced,
    # except a damaged one (skipped by the resume that led here), which is kept aside as checkpoint_N.damaged-*.
    saved = save_checkpoint_folder(accelerator, final_dir, write_files, metadata={"kind": "accelerator_state"},
                                   replace=not automatic, set_aside_damaged=automatic, after_commit=rotate,
                                   synchronous=synchronous)
    if saved is None:
        return None
    if automatic:
        config.iteration += 1
        if background_writer(accelerator) is None or synchronous:
            accelerator.wait_for_everyone()  # the rotation is done before any rank goes on
    return final_dir


def _resolve_input_dir(accelerator: Accelerator, input_dir: str | os.PathLike | None) -> str | None:
    """The folder to load; None only after a restart that came before the first checkpoint."""
    automatic = accelerator.project_configuration.automatic_checkpoint_naming
    if input_dir is None and not automatic:
        raise ValueError("load_state needs an input_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
    run_dir = _project_dir(accelerator, "load_state") if input_dir is None else None
    return find_resume_folder(input_dir, run_dir, latest_when_unset=True, conventions=[ACCELERATOR_CONVENTION],
                              automatic_reason=elastic_reason(accelerator.config.elastic),
                              io=checkpoint_io_of(accelerator))


def _read_optional(directory: str, name: str) -> Any:
    return state_io.load_state(directory, name) if os.path.isfile(os.path.join(directory, f"{name}.json")) else None


def _check_count(what: str, saved: int, current: int) -> None:
    if saved != current:
        raise CheckpointMismatchError(f"number of {what} (checkpoint {saved}, prepared now {current})", [], [], [])


def _check_counts(info: dict[str, Any], prepared: PreparedObjects, loaders: list[PreparedDataLoader]) -> None:
    counts = info["counts"]
    _check_count("models", len(info["models"]), len(prepared.models))
    _check_count("optimizers", len(info["optimizers"]), len(prepared.optimizers))
    _check_count("schedulers", counts["schedulers"], len(prepared.schedulers))
    _check_count("dataloaders", counts["dataloaders"], len(loaders))
    _check_count("registered objects", counts["custom_objects"], len(prepared.custom_objects))


def load_accelerator_state(accelerator: Accelerator, input_dir: str | os.PathLike | None = None, *,
                           verify_checksums: bool = True, dataloaders: Sequence[PreparedDataLoader] | None = None,
                           keep_global_batch: bool = True, **_ignored: Any) -> str | None:
    """Collective: restore everything :func:`save_accelerator_state` wrote; return the folder loaded.

    With no ``input_dir`` and automatic naming, the newest complete checkpoint is used (incomplete
    ones are skipped with a warning); none is an error, except after a torchelastic restart (the
    unchanged script running again), where it is logged and nothing is loaded (returns None).
    Nothing is changed unless the whole checkpoint is sound. Dataloaders get their epoch back, and
    their position inside it when they resume mid-epoch (``use_stateful_dataloader``). On another world size
    the accumulation is rescaled to keep the global batch (:mod:`.global_batch`; ``keep_global_batch=False``:
    the caller owns the accumulation and does it itself, as the Trainer does).
    """
    flush_background_writes(accelerator)  # a save still in flight is finished (and visible) before anything is read
    directory = _resolve_input_dir(accelerator, input_dir)
    if directory is None:
        return None
    # Found automatically (no input_dir): the finder has just checksummed it; sizes are checked again here.
    checkpoint_io_of(accelerator).read(directory, checksums=verify_checksums and input_dir is not None)
    info = state_io.read_json(os.path.join(directory, STATE_FILE))
    if info.get("format") != STATE_FORMAT:
        raise CheckpointMismatchError(f"format ({info.get('format')!r}, expected {STATE_FORMAT!r})", [], [], [])
    strategy, prepared = accelerator.strategy, accelerator.prepared
    tracked_loaders = _tracked_loaders(prepared, dataloaders)
    _check_counts(info, prepared, tracked_loaders)
    run_load_state_pre_hooks(accelerator, prepared.models, directory)

    # Read and check everything first ...
    pending: list[model_state.PendingModelLoad | model_state.PendingOptimizerLoad] = [
        model_state.prepare_model_load(strategy, model, directory, i) for i, model in enumerate(prepared.models)]
    for index, optimizer in enumerate(prepared.optimizers):
        pending.append(model_state.prepare_optimizer_load(strategy, _owning_model(prepared, index),
                                                          optimizer.optimizer, directory, index))
    schedulers = [state_io.load_state(directory, _scheduler_name(i)) for i in range(len(prepared.schedulers))]
    loaders = state_io.load_state(directory, "dataloaders")
    scaler = _read_optional(directory, "scaler")
    customs = [state_io.load_state(directory, f"custom_checkpoint_{i}") for i in range(len(prepared.custom_objects))]
    rng = _read_rng(directory, accelerator.process_index, int(info["world_size"]))
    rescale = _global_batch_rescale(accelerator, directory, tracked_loaders) if keep_global_batch else None

    # ... then apply it.
    for item in pending:
        item.apply()
    for scheduler, state in zip(prepared.schedulers, schedulers):
        scheduler.load_state_dict(state)
    _load_loaders(tracked_loaders, loaders, rng.get("dataloaders") if int(info["world_size"]) == accelerator.num_processes else None)
    if scaler:
        accelerator.precision.load_state_dict(scaler)
    for obj, state in zip(prepared.custom_objects, customs):
        obj.load_state_dict(state)
    if rescale is not None:
        _apply_rescale(accelerator, rescale, info.get("scheduler_steps_per_call"))
    accelerator.step = int(info.get("step", 0))
    if accelerator.project_configuration.automatic_checkpoint_naming:
        accelerator.project_configuration.iteration = int(info.get("iteration", 0)) + 1
    restore_rng_state(rng, accelerator.device)  # last: nothing after it may draw random numbers
    if accelerator.is_main_process:
        logger.info("Loaded checkpoint %s", directory)
    return directory


def _load_loaders(loaders: Sequence[PreparedDataLoader], states: list[Any], passes: list[Any] | None) -> None:
    """Each loader's position, and this process's draws of its pass in progress (``passes``: None when the checkpoint
    comes from another number of processes, whose ranks read other batches)."""
    for index, (loader, state) in enumerate(zip(loaders, states)):
        loader.load_state_dict(state)
        loader.load_random_state(passes[index] if passes and index < len(passes) else None)


def _global_batch_rescale(accelerator: Accelerator, directory: str,
                          loaders: Sequence[PreparedDataLoader]) -> Rescale | None:
    """The accumulation that keeps the checkpoint's global batch here (None: nothing to change), refused early."""
    saved = saved_batch_shape(directory)
    if saved is None or not loaders:
        return None
    current = BatchShape(accelerator.num_processes, loaders[0].global_batch_size, accelerator.gradient_accumulation_steps)
    return keep_global_batch(saved, current, directory)


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


def _read_rng(directory: str, rank: int, saved_world: int) -> dict[str, Any]:
    source = rank if rank < saved_world else rank % saved_world
    if source != rank:
        logger.warning("Checkpoint saved on %d processes: rank %d takes the random state of rank %d.", saved_world, rank, source)
    return state_io.read_json(os.path.join(directory, f"random_states_{source}.json"))
