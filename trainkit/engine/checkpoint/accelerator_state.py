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
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from . import model_state, state_io
from .atomic import (
    atomic_checkpoint,
    decide_on_rank0,
    latest_complete_checkpoint,
    rotate_checkpoints,
    verify_checkpoint,
)
from .errors import CheckpointMismatchError
from .rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

STATE_FILE = "accelerator_state.json"
STATE_FORMAT = "trainkit-accelerator-state/1"
AUTOMATIC_PREFIX = "checkpoint_"
CHECKPOINTS_SUBDIR = "checkpoints"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchelastic in every worker: how many times the worker group was restarted (0 on the first attempt)."""

_resumed_from: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""accelerator -> the checkpoint it was loaded from: rotation never deletes it."""


def _automatic_parent(accelerator: Any) -> str:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise ValueError("automatic_checkpoint_naming needs a project_dir (Accelerator(project_dir=...)).")
    return os.path.join(project_dir, CHECKPOINTS_SUBDIR)


def _wants_sharded(accelerator: Any, model: torch.nn.Module, sharded: bool | None) -> bool:
    if sharded is not None:
        return sharded
    return model_state.is_sharded(model) and bool(getattr(accelerator.strategy, "sharded_checkpoints", True))


def _owning_model(accelerator: Any, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The prepared model holding all of ``optimizer``'s parameters (torch's API needs it to name them)."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in accelerator._models:
        if wanted <= {id(p) for p in model.parameters()}:
            return model
    return None


def _tracked_loaders(accelerator: Any, dataloaders: Sequence[Any] | None) -> list[Any]:
    """The loaders whose positions a checkpoint holds: those given, else every prepared one."""
    return list(accelerator._dataloaders) if dataloaders is None else list(dataloaders)


def write_state_files(accelerator: Any, directory: str, sharded: bool | None = None,
                      dataloaders: Sequence[Any] | None = None) -> None:
    """Collective: write the accelerator's whole state into the existing, empty ``directory`` (not atomic by itself).

    ``sharded``: True writes DCP shards, False full tensors on rank 0; None decides per model
    (sharded for FSDP2 unless the plugin says ``FULL_STATE_DICT``). ``dataloaders``: the prepared loaders
    whose positions to store (default: all; the Trainer passes its training loader only, since an
    evaluation loader's position means nothing and how many exist depends on when the checkpoint is taken).
    """
    main = accelerator.is_main_process
    loaders = _tracked_loaders(accelerator, dataloaders)
    layout: dict[str, Any] = {"models": [], "optimizers": []}
    for index, model in enumerate(accelerator._models):
        use_sharded = _wants_sharded(accelerator, model, sharded)
        model_state.save_model(model, directory, index, use_sharded, main)
        layout["models"].append("sharded" if use_sharded else "full")
    for index, prepared in enumerate(accelerator._optimizers):
        optimizer = prepared.optimizer
        owner = _owning_model(accelerator, optimizer)
        if owner is None:
            raise ValueError(f"Optimizer {index} holds parameters of no prepared model; prepare its model too.")
        use_sharded = _wants_sharded(accelerator, owner, sharded)
        model_state.save_optimizer(owner, optimizer, directory, index, use_sharded, main)
        layout["optimizers"].append("sharded" if use_sharded else "full")
    # Every rank asks: a streamed loader's position gathers all ranks' readers (a collective).
    loader_states = [loader.state_dict() for loader in loaders]
    if main:
        for index, scheduler in enumerate(accelerator._schedulers):
            state_io.save_state(scheduler.state_dict(), directory, f"scheduler{'' if index == 0 else f'_{index}'}")
        state_io.save_state(loader_states, directory, "dataloaders")
        state_io.save_state(accelerator.precision.state_dict(), directory, "scaler")
        for index, obj in enumerate(accelerator._custom_objects):
            state_io.save_state(obj.state_dict(), directory, f"custom_checkpoint_{index}")
        state_io.write_json({
            "format": STATE_FORMAT,
            "step": accelerator.step,
            "iteration": accelerator.project_configuration.iteration,
            "world_size": accelerator.num_processes,
            "counts": {"schedulers": len(accelerator._schedulers), "dataloaders": len(loaders),
                       "custom_objects": len(accelerator._custom_objects)},
            **layout,
        }, os.path.join(directory, STATE_FILE))
    state_io.write_json(capture_rng_state(), os.path.join(directory, f"random_states_{accelerator.process_index}.json"))


def save_accelerator_state(accelerator: Any, output_dir: str | os.PathLike | None = None, *,
                           sharded: bool | None = None, dataloaders: Sequence[Any] | None = None,
                           **_ignored: Any) -> str:
    """Collective: write a complete, atomic checkpoint and return its folder.

    An explicit ``output_dir`` that holds a complete checkpoint is replaced atomically (an empty one is
    fine; any other existing folder is refused). With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
    ``project_dir/checkpoints/checkpoint_{iteration}``; afterwards the iteration advances and the oldest
    complete checkpoints beyond ``total_limit`` are deleted (never the newest nor the one resumed from).
    """
    config = accelerator.project_configuration
    automatic = config.automatic_checkpoint_naming
    if automatic:
        output_dir = os.path.join(_automatic_parent(accelerator), f"{AUTOMATIC_PREFIX}{config.iteration}")
    elif output_dir is None:
        raise ValueError("save_state needs an output_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
    final_dir = os.path.normpath(os.fspath(output_dir))
    # An explicit folder may be saved to again (a common Accelerate habit): the new checkpoint replaces
    # the old one by renames, never by writing into it. Automatically named folders are never replaced.
    with atomic_checkpoint(final_dir, metadata={"kind": "accelerator_state"}, replace=not automatic) as staging:
        write_state_files(accelerator, staging, sharded, dataloaders)
    if automatic:
        config.iteration += 1
        if accelerator.is_main_process and config.total_limit:
            rotate_checkpoints(os.path.dirname(final_dir), config.total_limit,
                               protected=[_resumed_from.get(accelerator)], prefix=AUTOMATIC_PREFIX)
        accelerator.wait_for_everyone()
    return final_dir


def restart_count() -> int:
    """How many times torchelastic restarted this job's workers (``TORCHELASTIC_RESTART_COUNT``; 0 outside it)."""
    try:
        return int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)
    except ValueError:
        return 0


def _resolve_input_dir(accelerator: Any, input_dir: str | os.PathLike | None) -> str | None:
    """The folder to load; None only after a restart that came before the first checkpoint."""
    if input_dir is not None:
        return os.path.normpath(os.fspath(input_dir))
    if not accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError("load_state needs an input_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
    parent = _automatic_parent(accelerator)
    # Rank 0 decides, so every rank loads the same folder even if one appears meanwhile.
    latest = decide_on_rank0("find the latest checkpoint", lambda: latest_complete_checkpoint(parent, AUTOMATIC_PREFIX))
    restarts = restart_count()
    if latest is None and not restarts:
        raise FileNotFoundError(f"No complete checkpoint in {parent}.")
    if restarts and accelerator.is_main_process:
        # The same script runs again after a failure: say what it continues from.
        if latest is None:
            logger.warning("Restart %d of this job: no complete checkpoint in %s yet, so nothing is loaded and "
                           "training starts from the beginning.", restarts, parent)
        else:
            logger.warning("Restart %d of this job: resuming from %s, the latest complete checkpoint.", restarts, latest)
    return latest


def _read_optional(directory: str, name: str) -> Any:
    return state_io.load_state(directory, name) if os.path.isfile(os.path.join(directory, f"{name}.json")) else None


def _check_count(what: str, saved: int, current: int) -> None:
    if saved != current:
        raise CheckpointMismatchError(f"number of {what} (checkpoint {saved}, prepared now {current})", [], [], [])


def load_accelerator_state(accelerator: Any, input_dir: str | os.PathLike | None = None, *,
                           verify_checksums: bool = True, dataloaders: Sequence[Any] | None = None,
                           **_ignored: Any) -> str | None:
    """Collective: restore everything :func:`save_accelerator_state` wrote; return the folder loaded.

    With no ``input_dir`` and automatic naming, the newest complete checkpoint is used (incomplete
    ones are skipped with a warning); none is an error, except after a torchelastic restart (the
    unchanged script running again), where it is logged and nothing is loaded (returns None).
    Nothing is changed unless the whole checkpoint is sound.
    """
    directory = _resolve_input_dir(accelerator, input_dir)
    if directory is None:
        return None
    verify_checkpoint(directory, checksums=verify_checksums)
    info = state_io.read_json(os.path.join(directory, STATE_FILE))
    if info.get("format") != STATE_FORMAT:
        raise CheckpointMismatchError(f"format ({info.get('format')!r}, expected {STATE_FORMAT!r})", [], [], [])
    counts = info["counts"]
    _check_count("models", len(info["models"]), len(accelerator._models))
    _check_count("optimizers", len(info["optimizers"]), len(accelerator._optimizers))
    _check_count("schedulers", counts["schedulers"], len(accelerator._schedulers))
    tracked_loaders = _tracked_loaders(accelerator, dataloaders)
    _check_count("dataloaders", counts["dataloaders"], len(tracked_loaders))
    _check_count("registered objects", counts["custom_objects"], len(accelerator._custom_objects))

    # Read and check everything first ...
    pending = [model_state.prepare_model_load(model, directory, i) for i, model in enumerate(accelerator._models)]
    for index, prepared in enumerate(accelerator._optimizers):
        owner = _owning_model(accelerator, prepared.optimizer)
        if owner is None:
            raise ValueError(f"Optimizer {index} holds parameters of no prepared model; prepare its model too.")
        pending.append(model_state.prepare_optimizer_load(owner, prepared.optimizer, directory, index))
    schedulers = [state_io.load_state(directory, f"scheduler{'' if i == 0 else f'_{i}'}")
                  for i in range(len(accelerator._schedulers))]
    loaders = state_io.load_state(directory, "dataloaders")
    scaler = _read_optional(directory, "scaler")
    customs = [state_io.load_state(directory, f"custom_checkpoint_{i}") for i in range(len(accelerator._custom_objects))]
    rng = _read_rng(directory, accelerator.process_index, int(info["world_size"]))

    # ... then apply it.
    for item in pending:
        item.apply()
    for scheduler, state in zip(accelerator._schedulers, schedulers):
        scheduler.load_state_dict(state)
    for loader, state in zip(tracked_loaders, loaders):
        loader.load_state_dict(state)
    if scaler:
        accelerator.precision.load_state_dict(scaler)
    for obj, state in zip(accelerator._custom_objects, customs):
        obj.load_state_dict(state)
    accelerator.step = int(info.get("step", 0))
    if accelerator.project_configuration.automatic_checkpoint_naming:
        accelerator.project_configuration.iteration = int(info.get("iteration", 0)) + 1
    restore_rng_state(rng)  # last: nothing after it may draw random numbers
    _resumed_from[accelerator] = directory
    if accelerator.is_main_process:
        logger.info("Loaded checkpoint %s", directory)
    return directory


def _read_rng(directory: str, rank: int, saved_world: int) -> dict[str, Any]:
    source = rank if rank < saved_world else rank % saved_world
    if source != rank:
        logger.warning("Checkpoint saved on %d processes: rank %d takes the random state of rank %d.", saved_world, rank, source)
    return state_io.read_json(os.path.join(directory, f"random_states_{source}.json"))
