"""Resuming from a ``checkpoint-N`` folder transformers' Trainer wrote, continuing as transformers would.

Such a folder holds the weights as ``save_pretrained`` writes them (``model.safetensors``, shards with an index,
or ``pytorch_model.bin``), ``optimizer.pt`` and ``scheduler.pt`` (torch state dicts), ``scaler.pt`` under fp16, the
random states (``rng_state.pth``, or ``rng_state_{rank}.pth`` per process), ``trainer_state.json`` and
``training_args.bin``. Nothing is unpickled beyond tensors and plain values: safetensors for the weights,
``torch.load(weights_only=True)`` for the rest, with only numpy's array types allowed in the random states (what
transformers allows). ``training_args.bin``, a pickle of transformers' arguments, is never read: this run's
arguments apply.

transformers continues epoch ``global_step // steps_per_epoch`` after skipping its first
``global_step % steps_per_epoch`` windows (unless ``ignore_data_skip``), and restores the random states once the
first window after them is read (at the epoch's start when nothing is skipped): the resume point this module
returns makes the Trainer's loop do the same, so the run continues with transformers' numbers.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainkit.engine import CheckpointMismatchError, load_full_weights, read_safetensors_weights

from .files import TRAINER_STATE_NAME, prepared_model
from .resume import ResumePoint

if TYPE_CHECKING:
    from .protocol import CheckpointedTrainer as Trainer

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
UNSUPPORTED = {"adapter_model.safetensors": "a PEFT adapter checkpoint", "adapter_model.bin": "a PEFT adapter checkpoint",
               "pytorch_model_fsdp_0": "an FSDP checkpoint", "global_step": "a DeepSpeed checkpoint"}


TRAINKIT_FILES = ("manifest.json", "accelerator_state.json", "training_args.json")
"""Any of these makes a folder trainkit's (a damaged one is then refused as such, never read as transformers')."""


def is_transformers_checkpoint(folder: str) -> bool:
    """A folder transformers' Trainer wrote: its ``trainer_state.json`` and weights, and none of trainkit's files."""
    if not os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
        return False
    names = set(os.listdir(folder))
    if names & set(TRAINKIT_FILES):
        return False
    return bool(names & set(WEIGHT_FILES)) or any(name.startswith(tuple(UNSUPPORTED)) for name in names)


def _load(path: str) -> Any:
    """``torch.load`` of tensors and plain values only (numpy's array types allowed, for the random states)."""
    np_core = getattr(np, "_core", None) or np.core
    allowed = [np_core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


def _read_weights(folder: str) -> dict[str, torch.Tensor]:
    state = read_safetensors_weights(folder)  # one file, or shards with their index
    return state if state is not None else _load(os.path.join(folder, "pytorch_model.bin"))


def _with_tied_aliases(trainer: Trainer, model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``save_pretrained`` stores one name of each tied parameter (GPT-2's ``wte.weight``, not ``lm_head.weight``):
    give the others the same tensor so the strict load sees every name."""
    names: dict[int, list[str]] = {}
    for name, parameter in trainer.accelerator.strategy.unwrap_model(model).named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    for aliases in names.values():
        present = [name for name in aliases if name in state]
        for name in aliases:
            if present and name not in state:
                state[name] = state[present[0]]
    return state


def load_transformers_weights(trainer: Trainer, folder: str, model: Any = None) -> None:
    """Collective: the weights of a transformers checkpoint into ``model`` (default: the prepared model), keys
    checked first (``Trainer._load_from_checkpoint`` on such a folder)."""
    names = os.listdir(folder)
    for prefix, what in UNSUPPORTED.items():
        if any(name.startswith(prefix) for name in names):
            raise ValueError(f"{folder} is {what} written by transformers' Trainer; trainkit resumes transformers' "
                             "full-weight checkpoints (model.safetensors, optimizer.pt, scheduler.pt).")
    model = prepared_model(trainer) if model is None else model
    state = _with_tied_aliases(trainer, model, _read_weights(folder))
    load_full_weights(trainer.accelerator, model, state, what=f"model (transformers checkpoint {folder})")


def _load_optimizer(trainer: Trainer, folder: str) -> None:
    """``optimizer.pt`` into the optimizer, after checking that each saved state fits the parameter it lands on."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    saved = _load(os.path.join(folder, "optimizer.pt"))
    ours = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    theirs = [index for group in saved["param_groups"] for index in group["params"]]
    sizes = ([len(group["params"]) for group in optimizer.param_groups], [len(group["params"]) for group in saved["param_groups"]])
    if sizes[0] != sizes[1]:
        raise CheckpointMismatchError(f"optimizer (transformers checkpoint {folder}: parameter groups of {sizes[1]} "
                                      f"parameters, this optimizer's of {sizes[0]})", [], [], [])
    for parameter, index in zip(ours, theirs):
        for key, value in saved["state"].get(index, {}).items():
            if isinstance(value, torch.Tensor) and value.ndim and value.shape != parameter.shape:
                raise CheckpointMismatchError(f"optimizer (transformers checkpoint {folder}: state {key!r} of parameter "
                                              f"{index} is {list(value.shape)}, the parameter {list(parameter.shape)})",
                                              [], [], [])
    optimizer.load_state_dict(saved)


def _random_states_restorer(trainer: Trainer, folder: str) -> Callable[[], None] | None:
    """What puts this process's saved random states back (transformers' file for it), or None without one."""
    world = trainer.accelerator.num_processes
    name = f"rng_state_{trainer.accelerator.process_index}.pth" if world > 1 else "rng_state.pth"
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        logger.warning("%s has no %s (saved on another number of processes?): the random states start afresh, so "
                       "the run does not continue exactly.", folder, name)
        return None
    states = _load(path)

    def restore() -> None:
        random.setstate(states["python"])
        np.random.set_state(states["numpy"])
        torch.random.set_rng_state(states["cpu"])
        if torch.cuda.is_available() and "cuda" in states:
            cuda = states["cuda"]
            if isinstance(cuda, (list, tuple)):
                torch.cuda.random.set_rng_state_all(cuda)
            else:
                torch.cuda.random.set_rng_state(cuda)

    return restore


def resume_transformers_checkpoint(trainer: Trainer, folder: str, steps_per_epoch: int | None) -> ResumePoint:
    """Collective: the optimizer, schedule and scaler of a transformers checkpoint into ``trainer`` (its weights and
    ``trainer_state.json`` are loaded by the Trainer's hooks before); return where (and when to restore the random
    states) the loop continues, as transformers' own resume would."""
    if trainer.accelerator.is_main_process:
        logger.info("Resuming from %s, a checkpoint transformers' Trainer wrote", folder)
    if os.path.isfile(os.path.join(folder, "optimizer.pt")):
        _load_optimizer(trainer, folder)
    if os.path.isfile(os.path.join(folder, "scheduler.pt")):
        trainer.lr_scheduler.load_state_dict(_load(os.path.join(folder, "scheduler.pt")))
    scaler = getattr(trainer.accelerator, "scaler", None)
    if scaler is not None and os.path.isfile(os.path.join(folder, "scaler.pt")):
        scaler.load_state_dict(_load(os.path.join(folder, "scaler.pt")))
    restore = _random_states_restorer(trainer, folder)
    if trainer.args.ignore_data_skip or not steps_per_epoch:  # the epoch starts again from its first batch
        return ResumePoint(0, 0, restore)
    steps_done = trainer.state.global_step % steps_per_epoch
    return ResumePoint(steps_done, steps_done * trainer.accelerator.gradient_accumulation_steps, restore)
