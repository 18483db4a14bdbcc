"""The Trainer's ``checkpoint-N`` folders: written atomically, found, rotated, and the best weights loaded.

A folder is one atomic engine checkpoint (see docs/checkpoints.md) with the Trainer's files beside the
engine's, so every file is written once::

    checkpoint-N/
      model.safetensors | pytorch_model_fsdp_0/   weights: full on rank 0 (from_pretrained-able with config.json)
                                                  or, for FSDP's SHARDED_STATE_DICT, DCP shards (trainkit merge-weights)
      config.json, tokenizer files, training_args.json   written by Trainer.save_model -> _save (transformers' hooks)
      optimizer*, scheduler/custom_checkpoint_*, dataloaders.json, scaler.json, random_states_*.json,
      accelerator_state.json                     the engine's state (absent with save_only_model)
      trainer_state.json                         with the TrainerControl and stateful callbacks' states
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

from trainkit.engine import TRAINER_CONVENTION, PreparedDataLoader, latest_checkpoint_in, list_checkpoints

from ..callbacks import exported_states

if TYPE_CHECKING:  # the Trainer as this module sees it: a Protocol (the Trainer imports this module, not the reverse)
    from trainkit.engine import StagedCheckpoint
    from trainkit.trainer.training_arguments.arguments import TrainingArguments

    from .protocol import CheckpointedTrainer as Trainer

logger = logging.getLogger(__name__)

PREFIX = TRAINER_CONVENTION.prefix
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
MODEL_WEIGHTS_NAME = "model.safetensors"
ENGINE_STATE_NAME = "accelerator_state.json"
"""Present exactly when the checkpoint holds the engine's state (not with ``save_only_model``)."""
TRAINING_STATE_PATTERNS = ("optimizer*", "scheduler*", "scaler*", "dataloaders*", "custom_checkpoint_*",
                           "random_states_*", ENGINE_STATE_NAME, "manifest.json")
"""Files needed only to resume (left out of Hub uploads of the model; so is the manifest, which lists them)."""


def run_folder(trainer: Trainer) -> str:
    """Where this run's ``checkpoint-N`` folders go: ``checkpoint_dir`` (a folder or an object-store URL) when set,
    else ``output_dir``; a search trial's ``run-{id}`` folder in it (``Trainer._get_output_dir``, as transformers
    names it)."""
    folder, root = trainer._get_output_dir(trainer._trial), getattr(trainer.args, "checkpoint_dir", None)
    if not root:
        return folder
    trial = os.path.relpath(folder, trainer.args.output_dir)
    return root if trial == "." else f"{root.rstrip('/')}/{trial}" if "://" in root else os.path.join(root, trial)


def checkpoint_folder(output_dir: str, step: int) -> str:
    """``output_dir/checkpoint-{step}`` (a URL stays a URL)."""
    if "://" in output_dir:
        return f"{output_dir.rstrip('/')}/{PREFIX}{step}"
    return os.path.join(output_dir, f"{PREFIX}{step}")


def sorted_checkpoints(output_dir: str, complete_only: bool = True) -> list[str]:
    """checkpoint-N folders in the local folder ``output_dir`` by increasing N (complete ones only, unless told
    otherwise)."""
    return [entry.path for entry in list_checkpoints(output_dir, PREFIX)
            if not entry.staging and (entry.complete or not complete_only)]


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in the local folder ``output_dir``; newer incomplete ones are skipped with a
    warning."""
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
    """Collective: write ``folder`` atomically through the Accelerator's checkpointer (see the module doc); return
    it (None: skipped while another save is in flight, with ``async_save_when_busy="skip"``).

    An existing sound checkpoint of the same name (from an earlier run in the same output_dir) is replaced once the
    new one is complete; one that does not verify (the newer checkpoint a resumed run skipped) is kept aside. With
    ``async_save`` the files are captured now and written in the background; ``after_commit`` runs once the
    checkpoint is visible, on the process that wrote its shared files.
    """
    args, state = trainer.args, trainer.state
    metadata = {"kind": "trainer_checkpoint", "global_step": state.global_step}
    loaders = training_loaders(trainer.callback_handler.train_dataloader)

    def write_files(staged: StagedCheckpoint) -> None:
        if args.save_only_model:
            staged.write_model(prepared_model(trainer))
        else:
            staged.write_engine_state(dataloaders=loaders)
        # transformers' hooks: save_model -> _save add the config, processing class and arguments (the weights are
        # the engine's, written above); every process calls them (save_model ends in a barrier), the process that
        # writes the checkpoint's shared files writes them, into a local folder the checkpoint takes in.
        with staged.local_folder() as local:
            trainer._engine_saved_weights_to = local
            try:
                trainer.save_model(local, _internal_call=True)
            finally:
                trainer._engine_saved_weights_to = None
            if staged.writes_shared:
                trainer.state.save_to_json(os.path.join(local, TRAINER_STATE_NAME))

    return trainer.accelerator.checkpointer.save(folder, write_files, metadata=metadata, replace=True,
                                                 set_aside_damaged=True, after_commit=after_commit,
                                                 synchronous=synchronous)


def prepared_model(trainer: Trainer) -> Any:
    """The model as the engine prepared it (DDP/FSDP), without torch.compile's wrapper."""
    return getattr(trainer.model_wrapped, "_orig_mod", trainer.model_wrapped)


def run_output_dir(args: TrainingArguments) -> str:
    """The run's folder, ``args.output_dir``: a str once the arguments are built (``__post_init__`` gives
    transformers' default, "trainer_output"); None only when a script cleared it afterwards, which is refused."""
    if args.output_dir is None:
        raise ValueError("TrainingArguments.output_dir is None: the run needs a folder for its checkpoints and "
                         "markers; set output_dir.")
    return args.output_dir


def save_model_config(model: Any, folder: str) -> None:
    """Main process: the model's ``config.json`` and generation config, when it has them."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(folder)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and hasattr(generation_config, "save_pretrained") and \
            getattr(model, "can_generate", lambda: False)():
        generation_config.save_pretrained(folder)


def save_training_checkpoint(trainer: Trainer, resumed_from: str | None = None, *, only_if_best: bool = True,
                             synchronous: bool = False) -> str | None:
    """Collective: write checkpoint-{global_step}, rotate (never deleting ``resumed_from`` nor the best), upload;
    return the folder. Under save_strategy="best" only at a new best, unless ``only_if_best`` is False.
    With ``async_save`` rotation and upload follow the background commit; ``synchronous`` writes now anyway."""
    args, state = trainer.args, trainer.state
    is_best = state.best_global_step == state.global_step
    if only_if_best and args.save_strategy == "best" and not is_best:
        return None
    root = run_folder(trainer)
    folder = checkpoint_folder(root, state.global_step)
    if is_best:
        state.best_model_checkpoint = folder
    state.stateful_callbacks = exported_states(trainer._stateful_callbacks())  # transformers' JSON shape
    protected = [state.best_model_checkpoint, resumed_from]  # as of this save, even if rotation runs later
    checkpointer = trainer.accelerator.checkpointer

    def rotate_and_upload(committed: str) -> None:  # on the process that wrote the shared files (of each node)
        checkpointer.rotate(root, args.save_total_limit, protected=protected, prefix=PREFIX)
        if args.push_to_hub and trainer.accelerator.is_main_process:
            trainer._push_from_checkpoint(committed)

    saved = save_checkpoint(trainer, folder, after_commit=rotate_and_upload, synchronous=synchronous)
    if saved is not None and (checkpointer.background_writer() is None or synchronous):
        trainer.accelerator.wait_for_everyone()  # rotation and upload are done before any rank goes on
    return saved


def finish_background_save(trainer: Trainer) -> None:
    """Collective: wait for the checkpoint being written in the background (if any) and raise its error."""
    trainer.accelerator.checkpointer.flush()


# -- loading weights ------------------------------------------------------------------------------
def load_model_weights(trainer: Trainer, folder: str, checksums: bool = True, model: Any = None) -> None:
    """Collective: verify ``folder`` and load its model weights (full or sharded) into ``model`` (default: the
    prepared model; before ``prepare``, the plain one).

    Keys are checked before anything is copied: a checkpoint of another model names its missing,
    unexpected and mis-shaped keys and leaves the model untouched.
    """
    target = prepared_model(trainer) if model is None else model
    checkpointer = trainer.accelerator.checkpointer
    local = checkpointer.storage_for(folder).local_path(folder)
    unwrapped = trainer.accelerator.unwrap_model(target)
    if local is not None and _has_its_own_loader(unwrapped, os.path.join(local, MODEL_WEIGHTS_NAME)):
        checkpointer.open(folder, checksums=checksums)  # verified first
        from safetensors.torch import load_file

        unwrapped.load_state_dict(load_file(os.path.join(local, MODEL_WEIGHTS_NAME)))
    else:
        checkpointer.load_model(target, folder, 0, checksums=checksums)


def _has_its_own_loader(model: Any, full_weights: str) -> bool:
    """Whether ``model``'s class overrides ``load_state_dict`` (e.g. to resize a buffer to the saved shape) and the
    checkpoint holds its full weights in one file: it then gets them through that method, as transformers' Trainer
    loads them (strict: a mismatch still fails, naming the keys). Sharded models and checkpoints take the engine's
    path."""
    from torch import nn
    from torch.distributed.tensor import DTensor

    if type(model).load_state_dict is nn.Module.load_state_dict or not os.path.isfile(full_weights):
        return False
    return not any(isinstance(tensor, DTensor) for tensor in model.state_dict().values())
