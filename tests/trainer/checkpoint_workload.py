"""A small training job that exercises everything exact resumption depends on (shared by the checkpoint tests
and their multi-process worker): dropout, shuffling, gradient accumulation with a short last window, a
warmup-then-decay schedule, AdamW state, and evaluations between saves.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from trainkit import Trainer, TrainerCallback, TrainingArguments

NUM_SAMPLES, FEATURES = 44, 6


class RegressionData(Dataset):
    """Fixed random regression data."""

    def __init__(self, size: int = NUM_SAMPLES, seed: int = 1234) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = torch.randn(size, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class DropoutRegressor(nn.Module):
    """Two layers with dropout between them (the random stream must continue exactly on resume)."""

    def __init__(self, dropout: float | None = 0.3) -> None:
        """``dropout=None``: no dropout layer (a model whose result does not depend on a random stream)."""
        super().__init__()
        masks = [nn.Dropout(dropout)] if dropout is not None else []
        self.layers = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), *masks, nn.Linear(16, 1))

    def forward(self, x, labels=None):
        prediction = self.layers(x).squeeze(-1)
        output = {"logits": prediction}
        if labels is not None:
            output["loss"] = ((prediction - labels) ** 2).mean()
        return output


class StopAfter(TrainerCallback):
    """Stop training after optimizer step ``step`` (after that step's save): an interrupted run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def workload_args(output_dir: str, **extra) -> TrainingArguments:
    """Per process: batches of 2, windows of 3. On one process 44 samples make 22 batches, so 8 optimizer steps
    per epoch with a short last window of 1; on two, 11 batches per rank and 4 steps (the last window of 2)."""
    settings = dict(
        output_dir=output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=3, num_train_epochs=2,
        learning_rate=0.05, optim="adamw_torch", lr_scheduler_type="linear", warmup_steps=3, weight_decay=0.01,
        max_grad_norm=1.0, save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1,
        per_device_eval_batch_size=4, logging_steps=1, disable_tqdm=True, report_to="none", seed=11,
    )
    settings.update(extra)
    return TrainingArguments(**settings)


def dropout_regressor() -> DropoutRegressor:
    """The workload's model (a model_init with no argument: one taking an argument is passed the trial, None)."""
    return DropoutRegressor()


def make_trainer(output_dir: str, stop_after: int | None = None, compute_metrics=None, model_init=dropout_regressor,
                 **extra) -> Trainer:
    """A fresh Trainer for the workload (the model initialised from the arguments' seed)."""
    callbacks = [StopAfter(stop_after)] if stop_after is not None else []
    return Trainer(model_init=model_init, args=workload_args(output_dir, **extra), train_dataset=RegressionData(),
                   eval_dataset=RegressionData(8, seed=99), callbacks=callbacks, compute_metrics=compute_metrics)


def final_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The full weights (gathered under FSDP; collective), on the CPU."""
    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    return {key: value.detach().cpu().clone().contiguous() for key, value in state.items()}
