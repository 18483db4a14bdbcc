"""The Trainer on a streamed dataset, in real processes (CPU, gloo): ``stream_worker.py OUT two|one``.

``two`` (torchrun, 2 ranks, 2 DataLoader workers each): trains 8 steps on a json stream that went through
``map`` (so ``column_names is None``) and saves ``checkpoint-3`` and ``-6``; trains again from
``checkpoint-3`` into another folder; evaluates and predicts on the stream. ``one`` (one process) resumes
``checkpoint-3`` too. The model records the example ids of every batch it trains on; the ``map`` logs every
example it tokenises, per process (``reads/<run>/<pid>.txt``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from trainkit import Trainer, TrainerCallback, TrainingArguments

OUT = Path(sys.argv[1])
PHASE = sys.argv[2]
RANK = int(os.environ.get("RANK", "0"))
FILE_LENGTHS = (10, 12, 9, 11)
SEQUENCE = 3
READING = {"run": "none"}


class IdModel(nn.Module):
    """A tiny regression on token ids that remembers which examples it trained on (and predicts their ids)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 4)
        self.head = nn.Linear(4, 1)
        self.trained_on: list[list[int]] = []

    def forward(self, input_ids, labels, example_id):
        if self.training:
            self.trained_on.append(example_id.tolist())
        prediction = self.head(self.embed(input_ids).mean(1)).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels.float()), "logits": example_id.float()}


def stream():
    from datasets import load_dataset

    folder = OUT / "json"
    paths = []
    for number, length in enumerate(FILE_LENGTHS):
        path = folder / f"part{number}.jsonl"
        if not path.exists():
            folder.mkdir(exist_ok=True)
            path.write_text("".join(json.dumps({"id": number * 100 + i, "text": f"w{i} x y"}) + "\n" for i in range(length)))
        paths.append(str(path))

    def tokenise(example):
        log = OUT / "reads" / READING["run"]
        log.mkdir(parents=True, exist_ok=True)
        with open(log / f"{RANK}_{os.getpid()}.txt", "a") as handle:
            handle.write(f"{example['id']}\n")
        ids = [(example["id"] + k) % 50 for k in range(SEQUENCE)]
        return {"input_ids": ids, "labels": example["id"] % 7, "example_id": example["id"]}

    return load_dataset("json", data_files=paths, streaming=True, split="train").map(tokenise)


class LogReadsByEpoch(TrainerCallback):
    """Name the read log after the run and the epoch (workers are forked after this, at the epoch's first batch)."""

    def __init__(self, run: str) -> None:
        self.run = run

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        READING["run"] = f"{self.run}_e{train_dataloader.progress.epoch}"


def train(run: str, resume: str | None = None):
    args = TrainingArguments(output_dir=str(OUT / run), max_steps=8, save_steps=3, per_device_train_batch_size=4,
                             dataloader_num_workers=2, learning_rate=0.05, report_to="none", disable_tqdm=True,
                             include_num_input_tokens_seen=True, logging_steps=1, use_cpu=True)
    model = IdModel()
    trainer = Trainer(model=model, args=args, train_dataset=stream(), callbacks=[LogReadsByEpoch(run)])
    output = trainer.train(resume_from_checkpoint=resume)
    result = {"trained_on": model.trained_on, "global_step": output.global_step,
              "tokens_seen": trainer.state.num_input_tokens_seen}
    (OUT / f"{run}_rank{RANK}.json").write_text(json.dumps(result))
    return trainer


def main() -> None:
    if PHASE == "two":
        trainer = train("full")
        train("resumed2", resume=str(OUT / "full" / "checkpoint-3"))
        READING["run"] = "predict"
        output = trainer.predict(stream())
        metrics = trainer.evaluate(stream())
        if RANK == 0:
            (OUT / "predict.json").write_text(json.dumps({"ids": output.predictions.tolist(), "eval": metrics}))
    else:
        train("resumed1", resume=str(OUT / "full" / "checkpoint-3"))


if __name__ == "__main__":
    main()
