"""How long asynchronous saves keep the training loop waiting, the first one included, as a share of a synchronous
save: 1 and 2 processes (gloo, CPU).

Each run is a fresh set of processes (the first save of a process is what is measured): a stack of linear layers
(default 8 x 2048x2048, 33.6M parameters: 403 MB of weights and AdamW state) trained with
``ProjectConfiguration(async_save=True)`` (DDP on 2 processes); after a few steps (``--steps-between``) an
asynchronous ``save_state``, then more steps and saves, and last a synchronous ``save_state`` of the same state.
"blocked" is the time the slowest process spent inside ``save_state`` (each write is finished before the next save,
outside the timing); the ratios are blocked / synchronous save.
The first save used to allocate and touch its staging buffers, make the writer's process group and import DCP
while the loop waited; those now happen when the objects are prepared and after the first optimizer step, in the
background. One JSON line per run:

    .venv/bin/python benchmarks/checkpoint_first_save.py                      # this checkout
    .venv/bin/python benchmarks/checkpoint_first_save.py --trainkit /path/to/another/checkout   # e.g. before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launching import torchrun_command  # benchmarks/ is on sys.path: these files run as scripts

REPO = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import logging

    import torch
    import torch.distributed as dist

    from trainkit import Accelerator
    from trainkit.utils.dataclasses import ProjectConfiguration

    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(async_save=True))
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    distributed = dist.is_available() and dist.is_initialized()

    def steps(count: int) -> None:
        for _ in range(count):
            accelerator.backward(model(torch.randn(4, args.width)).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()

    def slowest(seconds: float) -> float:
        if not distributed:
            return seconds
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    def timed_save(folder: str) -> float:
        if distributed:
            dist.barrier()
        started = time.perf_counter()
        accelerator.save_state(folder)
        return slowest(time.perf_counter() - started)

    def finish_write() -> None:
        """Wait for the save in flight, outside the timed region (earlier trainkit: the writer's own function)."""
        if hasattr(accelerator, "checkpointer"):
            accelerator.checkpointer.flush()
        else:  # a checkout from before the checkpointer, measured with --trainkit
            from trainkit.engine.checkpoint.async_writer import flush_background_writes

            flush_background_writes(accelerator)

    steps(1 + args.steps_between)
    blocked = []
    for index in range(args.saves):
        blocked.append(timed_save(os.path.join(args.dir, f"async_{index}")))
        steps(args.steps_between)
        finish_write()  # the next save measures its own staging, not a wait for this write
    accelerator.project_configuration.async_save = False
    synchronous = timed_save(os.path.join(args.dir, "sync"))
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    if accelerator.is_main_process:
        print(json.dumps({
            "benchmark": "checkpoint_first_save", "processes": accelerator.num_processes,
            "state_mb": round(state_bytes / 1e6, 1), "sync_save_s": round(synchronous, 3),
            "first_blocked_s": round(blocked[0], 3), "first_ratio": round(blocked[0] / synchronous, 3),
            "later_blocked_s": [round(b, 3) for b in blocked[1:]],
            "later_ratios": [round(b / synchronous, 3) for b in blocked[1:]]}), flush=True)
    accelerator.end_training()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--steps-between", type=int, default=5)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--trainkit", default=str(REPO), help="the checkout whose trainkit is measured")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder)")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": args.trainkit}
    worker = ["--worker", "--layers", args.layers, "--width", args.width, "--saves", args.saves,
              "--steps-between", args.steps_between]
    for _ in range(args.repeats):
        for processes in args.processes:
            with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
                command = (torchrun_command(processes, __file__, *worker, "--dir", scratch) if processes > 1
                           else [sys.executable, __file__, *map(str, worker), "--dir", scratch])
                code = subprocess.run(command, env=env, timeout=args.timeout).returncode
                if code:
                    return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
