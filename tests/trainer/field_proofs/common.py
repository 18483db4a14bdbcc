"""What the field proofs share: the 2-step workload, recorders of what the model and torch saw, the ignore mode."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from tests.trainer.checkpoint_workload import make_trainer
from trainkit import TrainerCallback
from trainkit.config.ignored_field import ENV_VAR as IGNORE_FIELD_ENV

QUICK = dict(max_steps=2, save_strategy="no", eval_strategy="no")


def quick(tmp_path, **extra):
    """The checkpoint workload (CPU; batches of 2, windows of 3, AdamW, seed 11), 2 steps, no saves or
    evaluations unless asked."""
    return make_trainer(str(tmp_path / "out"), **{**QUICK, **extra})


class Forward(NamedTuple):
    """One call of the workload model's first layer, as the model saw it."""

    training: bool
    batch: int
    output_dtype: torch.dtype
    weight_dtype: torch.dtype
    inputs: torch.Tensor


def record_forwards(trainer) -> list[Forward]:
    """Every later call of the first layer of ``trainer``'s model (a forward hook: nothing of the Trainer's). With a
    ``model_init``, ``train()`` builds a fresh model (as transformers does): the hook goes onto that one too."""
    seen: list[Forward] = []
    hooked: set[int] = set()

    def hook(module, inputs, output):
        seen.append(Forward(module.training, inputs[0].shape[0], output.dtype, module.weight.dtype,
                            inputs[0].detach().float().clone()))

    def attach(model) -> None:
        layer = model.layers[0]
        if id(layer) not in hooked:
            hooked.add(id(layer))
            layer.register_forward_hook(hook)

    class AttachToTheTrainedModel(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            attach(model)

    attach(trainer.model)
    trainer.add_callback(AttachToTheTrainedModel())
    return seen


def training_samples(forwards: list[Forward]) -> int:
    return sum(f.batch for f in forwards if f.training)


def log_steps(trainer, key: str) -> list[int]:
    """The steps whose log entry has ``key`` (what on_log callbacks and trainer_state.json receive)."""
    return [entry["step"] for entry in trainer.state.log_history if key in entry]


def logged(trainer, key: str) -> list[Any]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


@contextlib.contextmanager
def optimizer_steps() -> Iterator[list[float]]:
    """The global gradient norm of the parameters at every torch optimizer step taken inside the block."""
    norms: list[float] = []

    def before_step(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        yield norms
    finally:
        handle.remove()


def calls_of(monkeypatch, owner: Any, name: str, call_through: bool = True) -> list[tuple[tuple, dict]]:
    """Record every call of ``owner.name`` (arguments as received); it still runs unless ``call_through`` is False."""
    seen: list[tuple[tuple, dict]] = []
    original = getattr(owner, name)

    def recording(*args, **kwargs):
        seen.append((args, kwargs))
        return original(*args, **kwargs) if call_through else (args[0] if args else None)

    monkeypatch.setattr(owner, name, recording)
    return seen


def ignore_mode_key() -> str:
    """The field the ignore-one-field run ignores now ('' normally): results of a shared run are cached under it."""
    return os.environ.get(IGNORE_FIELD_ENV, "")
