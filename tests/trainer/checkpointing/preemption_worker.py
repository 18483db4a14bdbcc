"""A Trainer job for the preemption tests, run by `trainkit launch` (2 gloo processes, CPU).

``preemption_worker.py OUTPUT_DIR EVENTS_FILE``: a deterministic regression model trained for 120 steps,
saving every 15 and evaluating every 20 steps. Each step, evaluation batch and checkpoint save takes a
little time (sleeps in the model and the processing class), so a test can signal the launcher at a chosen
moment; rank 0 appends what it is doing to EVENTS_FILE ("step N", "eval N", "save N") and every rank its
pid ("pid RANK PID"). Env ``SAVE_SECONDS`` sets how long each save's tokenizer write takes. At the end the
final weights go to OUTPUT_DIR/final and the process prints ``DONE``; with env ``REFERENCE_DIR`` the same
processes then train an uninterrupted run from scratch there.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainkit import Trainer, TrainerCallback, TrainingArguments

FEATURES = 4
# Sleeps only shape timing (signals land mid-step, mid-evaluation, mid-save); the numbers never depend on them,
# so a run that nobody signals (env NO_SLEEP) skips them.
PACED = not os.environ.get("NO_SLEEP")
STEP_SECONDS = 0.06 if PACED else 0.0
EVAL_BATCH_SECONDS = 0.15 if PACED else 0.0


def log_event(text: str) -> None:
    with open(EVENTS, "a", encoding="utf-8") as handle:
        handle.write(text + "\n")


class Data(Dataset):
    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = self.x @ torch.arange(1.0, FEATURES + 1) + 0.1 * torch.randn(size, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class SlowRegressor(nn.Module):
    """Deterministic (no dropout); each forward takes a moment so signals land mid-step or mid-evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x, labels=None):
        time.sleep(STEP_SECONDS if self.training else EVAL_BATCH_SECONDS)
        prediction = self.layers(x).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


class SlowSaver:
    """Stands in for a tokenizer: the main process writes it into every checkpoint, slowly."""

    def __init__(self, trainer_holder: list) -> None:
        self.trainer_holder = trainer_holder

    def save_pretrained(self, folder: str) -> None:
        log_event(f"save {self.trainer_holder[0].state.global_step}")
        time.sleep(float(os.environ.get("SAVE_SECONDS", "0.3")) if PACED else 0.0)
        with open(os.path.join(folder, "tokenizer_stand_in.txt"), "w", encoding="utf-8") as handle:
            handle.write("ok\n")


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            log_event(f"step {state.global_step}")


def train(output_dir: str) -> None:
    """Train (resuming when the previous run in ``output_dir`` was preempted); final weights to output_dir/final."""
    args = TrainingArguments(output_dir=output_dir, max_steps=120, per_device_train_batch_size=2,
                             per_device_eval_batch_size=2, learning_rate=0.05, save_steps=15, eval_strategy="steps",
                             eval_steps=20, logging_steps=1000, report_to="none", disable_tqdm=True, use_cpu=True,
                             optim="adamw_torch", seed=7)
    holder: list = []
    trainer = Trainer(model_init=SlowRegressor, args=args, train_dataset=Data(48, 1), eval_dataset=Data(16, 2),
                      processing_class=SlowSaver(holder), callbacks=[Progress()])
    holder.append(trainer)
    original_evaluate = trainer.evaluate

    def evaluate(*a, **k):
        if trainer.is_world_process_zero():
            log_event(f"eval {trainer.state.global_step}")
        return original_evaluate(*a, **k)

    trainer.evaluate = evaluate
    trainer.train()
    trainer.save_model(os.path.join(output_dir, "final"))


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    log_event(f"pid {rank} {os.getpid()}")
    train(sys.argv[1])
    if os.environ.get("REFERENCE_DIR"):
        # The uninterrupted run, in the same processes after the resumed one (saves a launch): from scratch in
        # a fresh output folder, seeded again by its Trainer.
        train(os.environ["REFERENCE_DIR"])
    print(f"DONE rank {rank}", flush=True)


EVENTS = sys.argv[2] if len(sys.argv) > 2 else os.devnull

if __name__ == "__main__":
    main()
