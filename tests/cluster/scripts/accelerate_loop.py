"""An Accelerate-style training loop, written once and run two ways: by ``trainkit launch`` (``__main__``)
and inside a Ray Train ``TorchTrainer`` training function (tests/cluster/scripts/ray_driver.py).

Only the two hooks differ between the two: where a resumed run's checkpoint comes from (``resume_from``) and
what happens after each ``save_state`` (``on_checkpoint``: Ray's ``ray.train.report``). Each rank appends
``{"step", "loss"}`` lines to ``losses-rank{R}.jsonl`` and rank 0 writes the final parameters, so two runs can
be compared step by step.
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
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator
from trainkit.utils import set_seed

EPOCHS, BATCH, SAMPLES, SAVE_EVERY = 2, 4, 64, 5  # 8 steps per epoch on 2 processes: saves at 5, 10, 15


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=g))


class StepCounter:
    """The optimizer steps taken, saved with the Accelerator's state (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def train(out_dir: str, resume_from: str | None = None,
          on_checkpoint: Callable[[str, int, float], None] | None = None, kill_at: int | None = None) -> None:
    """Train; checkpoint every SAVE_EVERY steps into ``out_dir/state-{step}``; resume from ``resume_from``.

    ``kill_at``: rank 1 kills its own process (SIGKILL) at that step, once (a marker file remembers it).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator()
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    counter = StepCounter()
    accelerator.register_for_checkpointing(counter)
    if resume_from is not None:
        accelerator.load_state(resume_from)
    step = counter.step
    losses = (out / f"losses-rank{accelerator.process_index}.jsonl").open("a")
    for epoch in range(step // len(loader), EPOCHS):
        batches = accelerator.skip_first_batches(loader, step % len(loader)) if epoch == step // len(loader) else loader
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step = counter.step = step + 1
            losses.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            losses.flush()
            if step == kill_at and accelerator.process_index == 1 and not (out / "killed").exists():
                (out / "killed").write_text(str(step))
                os.kill(os.getpid(), signal.SIGKILL)
            if step % SAVE_EVERY == 0:
                folder = accelerator.save_state(str(out / f"state-{step}"))
                if on_checkpoint is not None:
                    on_checkpoint(folder, step, loss.item())
    if accelerator.is_main_process:
        params = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
        (out / "final.json").write_text(json.dumps({"step": step, "params": params}))
    accelerator.end_training()


if __name__ == "__main__":
    train(sys.argv[1])
