"""A ``Trainer`` script, written once and run two ways: by ``trainkit launch`` (``__main__``) and inside a Ray
Train ``TorchTrainer`` training function (tests/cluster/scripts/ray_driver.py), which adds Ray's
``RayTrainReportCallback``, wraps the Trainer with ``prepare_trainer`` and resumes from Ray's checkpoint.

Rank 0 writes each logged step's loss to ``losses.jsonl`` and the final parameters to ``final.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from trainkit import Trainer, TrainerCallback, TrainingArguments
from trainkit.utils import set_seed

SAVE_STEPS, MAX_STEPS = 5, 16


class RegressionData(Dataset):
    def __init__(self, size: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, 8, generator=g)
        self.y = self.x.sum(dim=1) + 0.1 * torch.randn(size, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels), "logits": prediction}


class LossFile(TrainerCallback):
    """Rank 0 appends every logged training loss to ``losses.jsonl``; rank 1 may kill itself once at ``kill_at``."""

    def __init__(self, out: Path, kill_at: int | None) -> None:
        self.out, self.kill_at = out, kill_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            with (self.out / "losses.jsonl").open("a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.kill_at and args.process_index == 1 and not (self.out / "killed").exists():
            (self.out / "killed").write_text(str(state.global_step))
            os.kill(os.getpid(), signal.SIGKILL)


def train(out_dir: str, callbacks: list | None = None, prepare: Callable[[Trainer], Trainer] | None = None,
          resume_from: str | None = None, kill_at: int | None = None) -> Trainer:
    """Train MAX_STEPS steps, saving every SAVE_STEPS into ``out_dir/run``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    args = TrainingArguments(output_dir=str(out / "run"), per_device_train_batch_size=4, learning_rate=0.05,
                             max_steps=MAX_STEPS, logging_steps=1, save_steps=SAVE_STEPS, lr_scheduler_type="constant",
                             optim="sgd", seed=0, report_to="none", dataloader_num_workers=0)
    set_seed(0)  # before the model is built, as transformers' example scripts do
    trainer = Trainer(model=Regressor(), args=args, train_dataset=RegressionData(),
                      callbacks=[LossFile(out, kill_at), *(callbacks or [])])
    if prepare is not None:
        trainer = prepare(trainer)
    trainer.train(resume_from_checkpoint=resume_from)
    if trainer.is_world_process_zero():
        params = [p.detach().flatten().tolist() for p in trainer.model.parameters()]
        (out / "final.json").write_text(json.dumps({"step": trainer.state.global_step, "params": params}))
    return trainer


if __name__ == "__main__":
    train(sys.argv[1])
