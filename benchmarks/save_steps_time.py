"""Trainer step time with a checkpoint after every step (``save_steps=1``): no saves vs synchronous vs asynchronous.

A small MLP regressor (``--width`` hidden units, 4 layers, AdamW) trains ``--steps`` optimizer steps on one CPU
process, once per mode and repeat, interleaved: ``none`` (``save_strategy="no"``), ``sync`` (``save_steps=1``),
``async`` (``save_steps=1``, ``async_save=True``: a save that finds the previous one still being written waits
for it, the default) and ``async-skip`` (the same with ``async_save_when_busy="skip"``: that save is skipped);
``save_total_limit=2`` so the disk does not fill. The step time is the median of the per-step wall times after the
first 3 steps (``mean_s`` too: waits for a write show there first). For the asynchronous modes, how many saves
were written and skipped, and the mean time a save kept the loop inside ``save_state`` (staging, plus with ``async``
the wait for the previous write). One JSON line per repeat on stdout.

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


MODES = ("none", "sync", "async", "async-skip")


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


def run(mode: str, steps: int, width: int, batch: int, scratch: str) -> dict[str, float | int]:
    clock: list[float] = []  # the start of every step: consecutive differences include the step's save
    args = TrainingArguments(
        output_dir=f"{scratch}/{mode}", max_steps=steps, per_device_train_batch_size=batch, learning_rate=1e-4,
        save_strategy="no" if mode == "none" else "steps", save_steps=1, save_total_limit=2,
        async_save=mode.startswith("async"), async_save_when_busy="skip" if mode == "async-skip" else "wait",
        eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, dataloader_num_workers=0, seed=0, enable_jit_checkpoint=False,
    )

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.append(time.perf_counter())

    trainer = Trainer(model=Regressor(width), args=args, train_dataset=Data(steps * batch, width), callbacks=[Clock()])
    trainer.train()
    clock.append(time.perf_counter())  # train() has flushed the last asynchronous save
    per_step = [b - a for a, b in zip(clock, clock[1:])][3:]
    result: dict[str, float | int] = {"median_s": round(statistics.median(per_step), 4),
                                      "mean_s": round(statistics.mean(per_step), 4)}
    writer = trainer.accelerator.checkpointer.writer
    if writer is not None:
        result.update(written=writer.written, skipped=writer.skipped,
                      blocked_ms_per_save=round(1000 * writer.blocked_s_total / max(1, writer.written + writer.skipped), 1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    # The default is the case where a 37 MB write fits in a step; --width 512 --batch 256 is one where it does not.
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="none,sync,async,async-skip", help="comma-separated, of: " + ",".join(MODES))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        parameters = sum(p.numel() for p in Regressor(args.width).parameters())
        modes = args.modes.split(",")
        unknown = sorted(set(modes) - set(MODES))
        if unknown or "none" not in modes:
            parser.error(f"--modes {args.modes!r}: unknown {unknown}; choose from {MODES}, 'none' included (the reference)")
        for repeat in range(args.repeats):
            results = {mode: run(mode, args.steps, args.width, args.batch, f"{scratch}/{repeat}") for mode in modes}
            none = results["none"]["median_s"]
            print(json.dumps({"benchmark": "save_steps_time", "repeat": repeat, "parameters": parameters,
                              "width": args.width, "batch": args.batch, "steps": args.steps, "results": results,
                              **{f"{mode}_vs_none": round(results[mode]["median_s"] / none, 3)
                                 for mode in modes if mode != "none"}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
