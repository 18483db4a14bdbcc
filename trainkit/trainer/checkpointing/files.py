"""The Trainer's ``checkpoint-N`` folders: written atomically, found, rotated, and the best weights loaded.

A folder is one atomic engine checkpoint (see docs/checkpoints.md) with the Trainer's files beside the
engine's, so every file is written once::

    checkpoint-N/
      model.safetensors | pytorch_model_fsdp_0/   weights: full on rank 0 (from_pretrained-able with config.json)
                                                  or, for FSDP's SHARDED_STATE_DICT, DCP shards (trainkit merge-weights)
      config.json, tokenizer files               transformers objects, when the model and processing class have them
      optimizer*, scheduler/custom_checkpoint_*, dataloaders.json, scaler.json, random_states_*.json,
      accelerator_state.json                     the engine's state (absent with save_only_model)
      training_args.json, trainer_state.json
      manifest.json                              written last, after every rank confirmed its writes

The folder is staged under a hidden name and renamed into place once complete, so a process killed
while saving leaves the previous checkpoints untouched; "complete" means the manifest matches the files.
Resuming is in :mod:`.resume`; the Trainer reaches both through its one :class:`.manager.CheckpointManager`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainkit.engine.checkpoint import (
    list_checkpoints,
    model_state,
    verify_checkpoint,
    write_state_files,
)
from trainkit.engine.checkpoint.async_writer import background_writer, flush_background_writes
from trainkit.engine.checkpoint.resume_folder import TRAINER_CONVENTION, latest_checkpoint_in
from trainkit.engine.checkpoint.saving import save_checkpoint_folder
from trainkit.engine.checkpoint.storage import checkpoint_io_of
from trainkit.engine.data import PreparedDataLoader

if TYPE_CHECKING:  # the Trainer as this module sees it: a Protocol (the Trainer imports this module, not the reverse)
    from .protocol import CheckpointedTrainer as Trainer

logger = logging.getLogger(__name__)

PREFIX = TRAINER_CONVENTION.prefix
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
MODEL_WEIGHTS_NAME = model_state.model_file(0)
ENGINE_STATE_NAME = "accelerator_state.json"
"""Present exactly when the checkpoint holds the engine's state (not with ``save_only_model``)."""
TRAINING_STATE_PATTERNS = ("optimizer*", "scheduler*", "scaler*", "dataloaders*", "custom_checkpoint_*",
                           "random_states_*", ENGINE_STATE_NAME, "manifest.json")
"""Files needed only to resume (left out of Hub uploads of the model; so is the manifest, which lists them)."""


def checkpoint_folder(output_dir: str, step: int) -> str:
    """``output_dir/checkpoint-{step}``."""
    return os.path.join(output_dir, f"{PREFIX}{step}")


def run_folder(trainer: Trainer) -> str:
    """The folder of this run's checkpoints: ``output_dir``, or a search trial's ``run-{id}`` in it
    (``Trainer._get_output_dir``, as transformers names it)."""
    return trainer._get_output_dir(trainer._trial)


def sorted_checkpoints(output_dir: str, complete_only: bool = True) -> list[str]:
    """checkpoint-N folders in ``output_dir`` by increasing N (complete ones only, unless told otherwise)."""
    return [entry.path for entry in list_checkpoints(output_dir, PREFIX)
            if not entry.staging and (entry.complete or not complete_only)]


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in ``output_dir``; newer incomplete ones are skipped with a warning."""
    return latest_checkpoint_in(output_dir, [TRAINER_CONVENTION])


# -- writing ---------------------------------------------------------------------------------------
def training_loaders(train_dataloader: Any) -> list[Any]:
    """The loaders whose positions a Trainer checkpoint holds: the training loader only.

    Evaluation loaders are prepared too, but their position means nothing, and how many exist depends on
    when the checkpoint was taken (before or after the first evaluation): counting them would make a
    checkpoint taken after an evaluation unloadable by a run that has not evaluated yet.
    """
    return [train_dataloader] if isinstance(train_dataloader, PreparedDataLoader) else []


def save_checkpoint(trainer: Trainer, folder: str, after_commit: Callable[[str], None] | None = None,
                    synchronous: bool = False) -> str | None:
    """Collective: write ``folder`` atomically (see the module doc); return it (None: skipped while another
    save is in flight, with ``async_save_when_busy="skip"``).

    An existing sound checkpoint of the same name (from an earlier run in the same output_dir) is replaced
    by renames once the new one is complete; one that does not verify (the newer checkpoint a resumed run
    skipped because it was truncated or corrupted) is kept aside as ``checkpoint-N.damaged-{time}``.
    With ``async_save`` the files are captured now and written in the background; ``after_commit`` runs
    once the folder is visible (on the writer's thread then).
    """
    accelerator, args = trainer.accelerator, trainer.args
    metadata = {"kind": "trainer_checkpoint", "global_step": trainer.state.global_step}

    def write_files(staging: str) -> None:
        if args.save_only_model:
            model, strategy = prepared_model(trainer), accelerator.strategy
            model_state.save_model(strategy, model, staging, 0, strategy.checkpoint_is_sharded(model),
                                   accelerator.is_main_process)
        else:
            loaders = training_loaders(trainer.callback_handler.train_dataloader)
            write_state_files(accelerator, staging, dataloaders=loaders)
        if accelerator.is_main_process:
            save_model_companions(trainer, staging)
            with open(os.path.join(staging, TRAINING_ARGS_NAME), "w", encoding="utf-8") as handle:
                handle.write(args.to_json_string())
            trainer.state.save_to_json(os.path.join(staging, TRAINER_STATE_NAME))

    saved = save_checkpoint_folder(accelerator, folder, write_files, metadata=metadata, replace=True,
                                   set_aside_damaged=True, after_commit=after_commit, synchronous=synchronous)
    return None if saved is None else os.path.normpath(folder)


def prepared_model(trainer: Trainer) -> Any:
    """The model as the engine prepared it (DDP/FSDP), without torch.compile's wrapper."""
    return getattr(trainer.model_wrapped, "_orig_mod", trainer.model_wrapped)


def save_model_companions(trainer: Trainer, folder: str) -> None:
    """Main process: ``config.json``, the generation config and the tokenizer, when the objects have them."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    config = getattr(unwrapped, "config", None)
    if hasattr(config, "save_pretrained"):
        config.save_pretrained(folder)
    generation_config = getattr(unwrapped, "generation_config", None)
    if hasattr(generation_config, "save_pretrained") and getattr(unwrapped, "can_generate", lambda: False)():
        generation_config.save_pretrained(folder)
    if hasattr(trainer.processing_class, "save_pretrained"):
        trainer.processing_class.save_pretrained(folder)


def save_model_files(trainer: Trainer, folder: str) -> None:
    """Collective: full weights as safetensors (sharded above 10GB), plus config and tokenizer (``Trainer.save_model``)."""
    accelerator = trainer.accelerator
    accelerator.save_model(trainer.model_wrapped, folder)
    if accelerator.is_main_process:
        save_model_companions(trainer, folder)


def save_training_checkpoint(trainer: Trainer, resumed_from: str | None = None, *, only_if_best: bool = True,
                             synchronous: bool = False) -> str | None:
    """Collective: write checkpoint-{global_step}, rotate (never deleting ``resumed_from`` nor the best), upload;
    return the folder. Under save_strategy="best" only at a new best, unless ``only_if_best`` is False.
    With ``async_save`` rotation and upload follow the background commit; ``synchronous`` writes now anyway."""
    args, state = trainer.args, trainer.state
    is_best = state.best_global_step == state.global_step
    if only_if_best and args.save_strategy == "best" and not is_best:
        return None
    run_dir = run_folder(trainer)
    folder = checkpoint_folder(run_dir, state.global_step)
    if is_best:
        state.best_model_checkpoint = folder
    state.stateful_callbacks = {type(cb).__name__: cb.state() for cb in trainer.callback_handler.callbacks
                                if callable(getattr(cb, "state", None))}
    protected = [state.best_model_checkpoint, resumed_from]  # as of this save, even if rotation runs later
    step, hub = state.global_step, trainer.hub

    def rotate_and_upload(committed: str) -> None:
        if not trainer.accelerator.is_main_process:
            return
        checkpoint_io_of(trainer.accelerator).rotate(run_dir, args.save_total_limit, protected=protected,
                                                     prefix=PREFIX)
        if hub is not None and args.hub_strategy != "end":
            in_repo = os.path.basename(committed) if args.hub_strategy in ("checkpoint", "all_checkpoints") else None
            ignored = None if args.hub_strategy == "all_checkpoints" else list(TRAINING_STATE_PATTERNS)
            hub.upload(committed, f"Training in progress, step {step}", path_in_repo=in_repo, ignore_patterns=ignored)

    saved = save_checkpoint(trainer, folder, after_commit=rotate_and_upload, synchronous=synchronous)
    if saved is not None and (background_writer(trainer.accelerator) is None or synchronous):
        trainer.accelerator.wait_for_everyone()  # rotation and upload are done before any rank goes on
    return None if saved is None else os.path.normpath(folder)


def finish_background_save(trainer: Trainer) -> None:
    """Collective: wait for the checkpoint being written in the background (if any) and raise its error."""
    flush_background_writes(trainer.accelerator)


# -- loading weights ------------------------------------------------------------------------------
def load_model_weights(trainer: Trainer, folder: str, checksums: bool = True) -> None:
    """Collective: verify ``folder`` and load its model weights (full or sharded) into the prepared model.

    Keys are checked before anything is copied: a checkpoint of another model names its missing,
    unexpected and mis-shaped keys and leaves the model untouched.
    """
    verify_checkpoint(folder, checksums=checksums)
    model_state.prepare_model_load(trainer.accelerator.strategy, prepared_model(trainer), folder, 0).apply()


def has_engine_state(folder: str) -> bool:
    """False for a ``save_only_model`` checkpoint (weights, config and trainer state only)."""
    return os.path.isfile(os.path.join(folder, ENGINE_STATE_NAME))

