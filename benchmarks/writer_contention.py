"""What a background checkpoint writer costs the training loop, as a thread of the process or as a process of its own.

The loop trains a small MLP (4 linear layers of ``--width``, batch ``--batch``, AdamW, one torch thread) and
times its steps (median after 5) while, beside it, a writer repeats what the background writer does per save
of a ``--megabytes`` state: write a file, read it back for its SHA-256, fsync it. Three configurations, interleaved
``--repeats`` times: no writer, the writer as a thread (trainkit's), the writer as a process. If the GIL were the
bottleneck (the writer's Python parts holding it while the loop waits), the thread would cost clearly more than
the process; if cores are the bottleneck, both cost alike. One JSON line per repeat on stdout.

    .venv/bin/python benchmarks/writer_contention.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import torch


def write_hash_fsync(stop: Any, folder: str, megabytes: float) -> None:
    """The writer's per-save work, again and again until ``stop`` is set."""
    data = os.urandom(int(megabytes * 2**20))
    count = 0
    while not stop.is_set():
        path = os.path.join(folder, f"state{count % 2}")
        with open(path, "wb") as handle:
            handle.write(data)
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            os.fsync(handle.fileno())
        count += 1


def step_time(width: int, batch: int, steps: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters())
    inputs, times = torch.randn(batch, width), []
    for _ in range(steps):
        start = time.perf_counter()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--megabytes", type=float, default=9.5)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            result: dict[str, float] = {"none": step_time(args.width, args.batch, args.steps)}
            for kind in ("thread", "process"):
                stop = threading.Event() if kind == "thread" else multiprocessing.Event()
                make = threading.Thread if kind == "thread" else multiprocessing.Process
                writer = make(target=write_hash_fsync, args=(stop, folder, args.megabytes))
                writer.start()
                time.sleep(0.3)  # the writer is running when the steps are timed
                result[kind] = step_time(args.width, args.batch, args.steps)
                stop.set()
                writer.join()
            print(json.dumps({"benchmark": "writer_contention", "repeat": repeat, "cores": os.cpu_count(),
                              "step_ms": {k: round(1000 * v, 2) for k, v in result.items()},
                              "thread_vs_none": round(result["thread"] / result["none"], 2),
                              "process_vs_none": round(result["process"] / result["none"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
