"""Streamed data in real processes: who reads what, exactly-once epochs, and resuming without replay.

Run as ``python stream_checks.py OUT two`` under torchrun (2 gloo ranks on CPU): for each stream (a counting
torch IterableDataset with shards, a json stream through ``load_dataset(..., streaming=True)`` and ``map``,
the counting stream again with ``dispatch_batches=True``) and each number of DataLoader workers (0, 2), it reads one full epoch, then stops 3 batches into the
next, saves, and continues from the checkpoint in fresh loaders. ``python stream_checks.py OUT one``
(one process) continues the same checkpoints on one process. Every example read is logged by the
dataset itself (``reads/<scenario>/<rank>_<pid>.txt``), every example consumed is gathered with
``gather_for_metrics`` into ``consumed_<scenario>.json``; the test compares them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainkit import Accelerator, DataLoaderConfiguration

OUT = Path(sys.argv[1])
PHASE = sys.argv[2]
BATCH = 4
SHARDS, SHARD_LENGTH = 8, 6
FILE_LENGTHS = (10, 12, 9, 11)
STOP_AFTER = 3


READING = {"scenario": "none"}
"""What the reads logged now belong to (DataLoader workers are forked at each iteration, so they see it)."""


def log_read(example_id: int) -> None:
    folder = OUT / "reads" / READING["scenario"]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{os.environ.get('RANK', '0')}_{os.getpid()}.txt", "a") as handle:
        handle.write(f"{example_id}\n")


class CountingShards(IterableDataset):
    """8 shards of 6 ids; ``iter_shard`` seeks (reads nothing before ``start``) and logs every id it reads."""

    num_shards = SHARDS
    shuffle_shards = True

    def iter_shard(self, index: int, start: int = 0):
        for offset in range(start, SHARD_LENGTH):
            example_id = index * 100 + offset
            log_read(example_id)
            yield torch.tensor(example_id)

    def __iter__(self):
        for index in range(self.num_shards):
            yield from self.iter_shard(index)


def json_files() -> list[str]:
    folder = OUT / "json"
    folder.mkdir(exist_ok=True)
    paths = []
    for number, length in enumerate(FILE_LENGTHS):
        path = folder / f"part{number}.jsonl"
        if not path.exists():
            lines = [json.dumps({"id": number * 100 + i, "text": "word " * (i + 1)}) for i in range(length)]
            path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def json_stream():
    from datasets import load_dataset

    stream = load_dataset("json", data_files=json_files(), streaming=True, split="train")

    def tokenise(example):  # "reading" an example = tokenising it, counted here
        log_read(example["id"])
        return {"length": len(example["text"].split())}

    return stream.map(tokenise).remove_columns(["text"])


class OneExample(IterableDataset):
    """A stream of one example, without shards."""

    def __iter__(self):
        yield torch.tensor(7)


def ids_of(batch) -> torch.Tensor:
    return batch["id"] if isinstance(batch, dict) else batch


def loader(accelerator: Accelerator, kind: str, workers: int):
    dataset = json_stream() if kind == "json" else CountingShards()
    # "dispatch": the main process reads every global batch and sends each rank its slice.
    accelerator.dataloader_config.dispatch_batches = kind == "dispatch"
    return accelerator.prepare(DataLoader(dataset, batch_size=BATCH, num_workers=workers))


def consume(accelerator: Accelerator, prepared, scenario: str, limit: int | None = None) -> list[int]:
    READING["scenario"] = scenario
    ids: list[int] = []
    for step, batch in enumerate(prepared):
        ids += accelerator.gather_for_metrics(ids_of(batch)).tolist()
        if limit is not None and step + 1 == limit:
            break
    return ids


def write(name: str, value) -> None:
    (OUT / name).write_text(json.dumps(value))


def main() -> None:
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(data_seed=7))
    for kind in ("counting", "json", "dispatch"):
        for workers in ((0,) if kind == "dispatch" else (0, 2)):
            name = f"{kind}_w{workers}"
            checkpoint = OUT / f"ckpt_{name}"
            if PHASE == "two":
                first = loader(accelerator, kind, workers)
                epoch0 = consume(accelerator, first, f"{name}_epoch0")
                # Epoch 1 (its shard order reshuffled): stop after 3 batches, save, continue in a fresh loader.
                before = consume(accelerator, first, f"{name}_before", limit=STOP_AFTER)
                accelerator.save_state(checkpoint, dataloaders=[first])
                second = loader(accelerator, kind, workers)
                accelerator.load_state(checkpoint, dataloaders=[second])
                after = consume(accelerator, second, f"{name}_resume2")
                reference = loader(accelerator, kind, workers)  # epoch 1 read without a stop
                reference.set_epoch(1)
                uninterrupted = consume(accelerator, reference, f"{name}_reference")
                if accelerator.is_main_process:
                    write(f"consumed_{name}.json", {"epoch0": epoch0, "before": before, "after2": after,
                                                    "epoch1": uninterrupted})
            else:
                resumed = loader(accelerator, kind, workers)
                accelerator.load_state(checkpoint, dataloaders=[resumed])
                write(f"consumed1_{name}.json", {"after1": consume(accelerator, resumed, f"{name}_resume1")})
    if PHASE == "two":
        # A stream shorter than the processes (one example, no shards): every rank still takes the step.
        accelerator.dataloader_config.dispatch_batches = False
        short = accelerator.prepare(DataLoader(OneExample(), batch_size=BATCH))
        steps = [batch.tolist() for batch in short]
        gathered = [accelerator.gather_for_metrics(batch).tolist() for batch in short]
        write(f"one_example_rank{accelerator.process_index}.json", {"steps": steps, "gathered": gathered})
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
