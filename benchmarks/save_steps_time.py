"""Trainer step time with a checkpoint after every step (``save_steps=1``): no saves vs synchronous vs asynchronous.

A small MLP regressor (``--width`` hidden units, 4 layers, AdamW) trains ``--steps`` optimizer steps on one CPU
process, three times per repeat, interleaved: ``save_strategy="no"``, ``save_steps=1``, and ``save_steps=1`` with
``async_save=True`` (``save_total_limit=2`` so the disk does not fill). The step time is the median of the
per-step wall times after the first 3 steps. One JSON line per repeat and configuration on stdout.

    .venv/bin/python benchmarks/save_steps_time.py
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainkit import Trainer, TrainerCallback, TrainingArguments


class Data(Dataset):
    def __init__(self, size: int, width: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, width, generator=generator)
        self.y = torch.randn(size, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class Regressor(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[layer for _ in range(3) for layer in (nn.Linear(width, width), nn.ReLU())],
                                    nn.Linear(width, 1))

    def forward(self, x, labels=None):
        prediction = self.layers(x).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def run(mode: str, steps: int, width: int, batch: int, scratch: str) -> float:
    clock: list[float] = []  # the start of every step: consecutive differences include the step's save
    args = TrainingArguments(
        output_dir=f"{scratch}/{mode}", max_steps=steps, per_device_train_batch_size=batch, learning_rate=1e-4,
        save_strategy="no" if mode == "none" else "steps", save_steps=1, save_total_limit=2,
        async_save=mode == "async", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, dataloader_num_workers=0, seed=0, enable_jit_checkpoint=False,
    )

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.append(time.perf_counter())

    trainer = Trainer(model=Regressor(width), args=args, train_dataset=Data(steps * batch, width), callbacks=[Clock()])
    trainer.train()
    clock.append(time.perf_counter())  # train() has flushed the last asynchronous save
    per_step = [b - a for a, b in zip(clock, clock[1:])]
    return statistics.median(per_step[3:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        parameters = sum(p.numel() for p in Regressor(args.width).parameters())
        for repeat in range(args.repeats):
            times = {mode: run(mode, args.steps, args.width, args.batch, f"{scratch}/{repeat}") for mode in ("none", "sync", "async")}
            print(json.dumps({"benchmark": "save_steps_time", "repeat": repeat, "parameters": parameters,
                              "step_s": {k: round(v, 4) for k, v in times.items()},
                              "sync_vs_none": round(times["sync"] / times["none"], 3),
                              "async_vs_none": round(times["async"] / times["none"], 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
