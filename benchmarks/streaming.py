"""Streamed data: examples read and time per epoch on 1, 2 and 4 processes, and resume time after 90 % of an epoch.

The stream is a torch ``IterableDataset`` of 16 shards x 250 examples following trainkit's sharding protocol
(``num_shards`` / ``iter_shard``); reading one example costs ``--read-ms`` of waiting (a file or network read,
not CPU, so 4 processes on a small machine still measure reading, not core contention). Each run (one torchrun
launch per world size, gloo on CPU) measures, interleaved ``--repeats`` times:

* ``manual``: the hand-written baseline, a plain DataLoader over ``shards[rank::world]`` (ideal sharding);
* ``trainkit``: ``Accelerator.prepare(DataLoader(stream))`` for one epoch;
* ``resume``: 90 % of an epoch, ``save_state``, then a fresh loader, ``load_state`` and the remaining 10 %:
  the time from ``load_state`` to the end of the epoch, and the examples read after it.

One JSON line per (world size, measure) on stdout, with examples read per rank (counted by the dataset) and
the ratio to ``manual``. Run it with another trainkit on ``--trainkit-path`` to measure that version (the
"before" numbers in docs/streaming.md were taken with ``--trainkit-path /work/main``)::

    .venv/bin/python benchmarks/streaming.py --worlds 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launching import torchrun_command  # benchmarks/ is on sys.path: these files run as scripts

REPO = Path(__file__).resolve().parents[1]
SHARDS, PER_SHARD, BATCH = 16, 250, 8


def _launch(args: argparse.Namespace) -> int:
    path = args.trainkit_path or str(REPO)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([path, str(REPO / "benchmarks")])}
    for world in args.worlds:
        command = torchrun_command(world, __file__, "--worker", "--read-ms", args.read_ms, "--repeats", args.repeats,
                                   "--label", args.label or path)
        code = subprocess.run(command, env=env, timeout=args.timeout).returncode
        if code:
            return code
    return 0


def _worker(args: argparse.Namespace) -> None:
    import logging

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset

    from trainkit import Accelerator

    logging.disable(logging.WARNING)

    class Stream(IterableDataset):
        num_shards = SHARDS

        def __init__(self, shards=None) -> None:
            self.shards = list(range(SHARDS)) if shards is None else shards
            self.read = 0

        def iter_shard(self, index: int, start: int = 0):
            for offset in range(start, PER_SHARD):
                self.read += 1
                time.sleep(args.read_ms / 1000)
                yield torch.tensor([index * PER_SHARD + offset], dtype=torch.float32)

        def __iter__(self):
            for index in self.shards:
                yield from self.iter_shard(index)

    accelerator = Accelerator(cpu=True)
    world, rank = accelerator.num_processes, accelerator.process_index
    total = SHARDS * PER_SHARD
    steps = total // (BATCH * world)

    def epoch(loader, limit=None) -> int:
        count = 0
        for count, batch in enumerate(loader, 1):
            batch.sum()
            if limit is not None and count == limit:
                break
        return count

    def reads(dataset) -> list[int]:
        parts = [None] * world
        if world > 1:
            dist.all_gather_object(parts, dataset.read)
        else:
            parts = [dataset.read]
        return parts

    results: dict[str, list[float]] = {"manual": [], "trainkit": [], "resume": []}
    read_counts: dict[str, list[int]] = {}
    holder = [tempfile.mkdtemp(prefix="trainkit-stream-bench-")]
    if world > 1:
        dist.broadcast_object_list(holder, src=0)  # one checkpoint folder for every rank
    folder = holder[0]
    try:
        for _ in range(args.repeats):
            manual = Stream(list(range(SHARDS))[rank::world])
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            epoch(DataLoader(manual, batch_size=BATCH))
            accelerator.wait_for_everyone()
            results["manual"].append(time.perf_counter() - start)
            read_counts["manual"] = reads(manual)

            stream = Stream()
            loader = accelerator.prepare(DataLoader(stream, batch_size=BATCH))
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            epoch(loader)
            accelerator.wait_for_everyone()
            results["trainkit"].append(time.perf_counter() - start)
            read_counts["trainkit"] = reads(stream)

            stream = Stream()
            loader = accelerator.prepare(DataLoader(stream, batch_size=BATCH))
            epoch(loader, limit=int(steps * 0.9))
            checkpoint = os.path.join(folder, f"resume_{len(results['resume'])}")
            accelerator.save_state(checkpoint, dataloaders=[loader])
            resumed_stream = Stream()
            resumed = accelerator.prepare(DataLoader(resumed_stream, batch_size=BATCH))
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            accelerator.load_state(checkpoint, dataloaders=[resumed])
            epoch(resumed)
            accelerator.wait_for_everyone()
            results["resume"].append(time.perf_counter() - start)
            read_counts["resume"] = reads(resumed_stream)
    finally:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(folder, ignore_errors=True)
    if accelerator.is_main_process:
        manual = min(results["manual"])
        for name, times in results.items():
            print(json.dumps({"benchmark": "streaming", "label": args.label, "world": world, "measure": name,
                              "seconds": round(min(times), 3), "ratio_to_manual_epoch": round(min(times) / manual, 2),
                              "examples_read_per_rank": read_counts[name], "examples": total,
                              "read_ms": args.read_ms}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--read-ms", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trainkit-path", default=None, help="the trainkit checkout to measure (default: this one)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0
    return _launch(args)


if __name__ == "__main__":
    sys.exit(main())
