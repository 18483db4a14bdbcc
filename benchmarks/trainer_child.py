"""One timed training run for trainer_loop.py: a hand-written loop, trainkit.Trainer or transformers.Trainer.

Prints one JSON line: median steady-state step time, seconds from launch to the end of step one, and the CPU
seconds this process used until then (user + system, all threads: much less sensitive to a loaded machine than
the wall-clock figure). Heavy imports happen inside each branch, so start-up time is what each loop really costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

LAUNCH = float(os.environ.get("BENCH_LAUNCH_TIME", time.time()))
FIRST_STEP_CPU: list[float] = []  # process CPU seconds at the end of step one


def step_ended(ends: list[float]) -> None:
    ends.append(time.time())
    if not FIRST_STEP_CPU:
        FIRST_STEP_CPU.append(time.process_time())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["hand_written", "hand_written_tuned", "trainkit", "transformers"], required=True)
    parser.add_argument("--workload", default="bert-tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--bf16", action="store_true")
    return parser.parse_args()


class DictDataset:
    """A TensorDataset seen as dicts, the form Trainers feed to ``model(**batch)``."""

    def __init__(self, tensors, keys):
        self.tensors, self.keys = tensors, keys

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, index):
        return {key: tensor[index] for key, tensor in zip(self.keys, self.tensors)}


def workload(name: str):
    """(model taking **batch and returning .loss / ["loss"], dict dataset, per-device batch)."""
    import torch
    from torch import nn

    from benchmarks.workloads import build

    model, dataset, batch_size, _ = build(name)
    if name == "bert-tiny":
        return model, DictDataset(dataset.tensors, ["input_ids", "attention_mask", "labels"]), batch_size

    class WithLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values, labels):
            logits = self.inner(pixel_values)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    return WithLoss(model), DictDataset(dataset.tensors, ["pixel_values", "labels"]), batch_size


def report(step_ends: list[float], first_step_end: float, global_batch: int, warmup: int) -> None:
    if int(os.environ.get("RANK", 0)) != 0:
        return
    gaps = [b - a for a, b in zip(step_ends[warmup:], step_ends[warmup + 1:])]
    print(json.dumps({"step_s": statistics.median(gaps), "startup_s": first_step_end - LAUNCH,
                      "startup_cpu_s": FIRST_STEP_CPU[0], "global_batch": global_batch,
                      "imports_transformers": "transformers" in sys.modules}), flush=True)


def hand_written(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model, dataset, batch_size = workload(args.workload)
    model = DistributedDataParallel(model) if world > 1 else model
    sampler = DistributedSampler(dataset, seed=0) if world > 1 else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=sampler is None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    total = args.warmup + args.steps + 1
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=total)
    ends: list[float] = []
    model.train()
    epoch = 0
    while len(ends) < total:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(**batch)["loss"]
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step_ended(ends)
            if len(ends) == total:
                break
        epoch += 1
    report(ends, ends[0], batch_size * world, args.warmup)
    if world > 1:
        dist.destroy_process_group()


def with_trainer(args: argparse.Namespace) -> None:
    if args.loop == "trainkit":
        from trainkit import Trainer, TrainerCallback, TrainingArguments
    else:
        from transformers import Trainer, TrainerCallback, TrainingArguments
    import torch

    torch.manual_seed(0)
    model, dataset, batch_size = workload(args.workload)
    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            step_ended(ends)

    total = args.warmup + args.steps + 1
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch_size, max_steps=total,
        learning_rate=1e-4, weight_decay=0.0, optim="adamw_torch_fused", lr_scheduler_type="linear",
        max_grad_norm=0.0, logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, bf16=args.bf16, seed=0, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[StepClock()])
    trainer.train()
    world = int(os.environ.get("WORLD_SIZE", 1))
    report(ends, ends[0], batch_size * world, args.warmup)


if __name__ == "__main__":
    arguments = parse_args()
    # hand_written_tuned is the same loop; its parent sets the allocator variables trainkit sets itself.
    hand_written(arguments) if arguments.loop.startswith("hand_written") else with_trainer(arguments)
