"""Elastic test worker: an Accelerator loop that checkpoints every optimizer step and resumes from the latest.

Deterministic (float64 linear model, no dropout, a seeded shuffle, a LambdaLR schedule). At every optimizer
step rank 0 appends ``{"step", "ids" (of every process), "world", "accumulation", "attempt"}`` to ``OUT/ids.jsonl``,
then the step is checkpointed; a step re-done after a restart (logged, not yet saved) appears again. ``--hold-rank1-at N``:
on the first attempt, rank 1 writes ``OUT/held`` after step N and waits there to be killed (the test kills its
launcher). ``--slow-when-alone S``: on one process, sleep S seconds per step (time for a machine to rejoin).
Rank 0 writes the final parameters to ``OUT/final.json``.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from trainkit import Accelerator
from trainkit.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--hold-rank1-at", type=int, default=0)
parser.add_argument("--slow-when-alone", type=float, default=0.0)
args = parser.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)


class Examples(Dataset):
    """48 examples with fixed inputs and targets; each item carries its id."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(48, 6, generator=generator, dtype=torch.float64)
        self.y = self.x @ torch.linspace(-1, 1, 6, dtype=torch.float64) + 0.1 * torch.randn(48, generator=generator,
                                                                                              dtype=torch.float64)

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int):
        return {"id": index, "x": self.x[index], "y": self.y[index]}


set_seed(0)
accelerator = Accelerator(
    project_dir=str(out / "run"),
    project_config=ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=3),
    dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True),
)
model = torch.nn.Linear(6, 1, dtype=torch.float64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.99 ** step)
loader = DataLoader(Examples(), batch_size=2, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
# In an elastic job load_state() takes the latest checkpoint, or none on the very first start (a restart or a
# machine joining continues the run); the fixed reference run has no checkpoint to load at its start.
if accelerator.config.elastic or (out / "run" / "checkpoints").is_dir():
    accelerator.load_state()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank, world = accelerator.process_index, accelerator.num_processes
step = accelerator.step
log = open(out / "ids.jsonl", "a", encoding="utf-8")

start_epoch = loader.progress.epoch
for epoch in range(start_epoch, args.epochs):
    loader.set_epoch(epoch)
    ids: list[int] = []
    for batch in loader:
        with accelerator.accumulate(model):
            ids += batch["id"].tolist()
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            accelerator.step = step
            every_id = accelerator.gather(torch.tensor(ids)).tolist()
            if rank == 0:  # before the checkpoint: a step logged but not saved is re-done, and logged again
                log.write(json.dumps({"step": step, "ids": every_id, "world": world, "attempt": attempt,
                                      "accumulation": accelerator.gradient_accumulation_steps}) + "\n")
                log.flush()
            accelerator.save_state()
            ids = []
            if attempt == 0 and rank == 1 and step == args.hold_rank1_at:
                (out / "held").write_text(str(step))
                time.sleep(600)  # killed here, with its launcher
            if world == 1 and args.slow_when_alone:
                time.sleep(args.slow_when_alone)

if accelerator.is_main_process:
    weights = {name: tensor.detach().flatten().tolist() for name, tensor in accelerator.unwrap_model(model).state_dict().items()}
    (out / "final.json").write_text(json.dumps({"weights": weights, "steps": step, "lr": scheduler.get_last_lr()}))
accelerator.end_training()
