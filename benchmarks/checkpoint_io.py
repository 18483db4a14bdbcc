"""Checkpoint save/load time and size for a ~100M-parameter model on 2 processes: full vs sharded.

The model (a stack of 2048x2048 linear layers, ~100.7M parameters) is sharded with FSDP2 on 2 gloo
processes; AdamW has taken one step, so its state (2 tensors per parameter) is saved too. Each run
(interleaved, ``--repeats`` times) times ``save_state``, ``load_state`` (with and without the SHA-256 pass) and
the hand-written baseline for the same format: ``dcp.save`` / ``dcp.load`` of the model and optimizer
state dicts (sharded), or gathering full state dicts and ``safetensors.save_file`` on rank 0 (full).
Then the same save with ``ProjectConfiguration(async_save=True)``: ``async_blocked_s`` is the time ``save_state``
kept the training loop waiting (the slowest rank: staging into host buffers), ``async_durable_s`` the time until
the background writer had committed the checkpoint (durable and visible), ``async_blocked_ratio`` the blocked time
over the synchronous ``save_s``. Asynchronous saves are switched on just for that save here, so the staging memory
is not set up ahead (the first asynchronous save of a run is measured by ``checkpoint_first_save.py``). One JSON
line per run on stdout.

    .venv/bin/python benchmarks/checkpoint_io.py            # launches itself on 2 processes
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

from launching import (
    torchrun_command,  # benchmarks/ is on sys.path: these files run as scripts
)

REPO = Path(__file__).resolve().parents[1]


def _folder_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _launch(args: argparse.Namespace) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = torchrun_command(2, __file__, "--worker", "--layers", args.layers, "--width", args.width,
                               "--repeats", args.repeats, "--dir", args.dir)
    return subprocess.run(command, env=env, timeout=args.timeout).returncode


def _worker(args: argparse.Namespace) -> None:
    import logging

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from trainkit import Accelerator, FullyShardedDataParallelPlugin

    logging.disable(logging.WARNING)
    root = Path(args.dir)
    runs: dict[str, tuple] = {}
    for mode in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        torch.manual_seed(0)
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(state_dict_type=mode))
        model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))
        model(torch.randn(2, args.width)).sum().backward()
        optimizer.step()
        runs[mode] = (accelerator, model, optimizer)
    parameters = sum(p.numel() for p in runs["FULL_STATE_DICT"][1].parameters())  # DTensor.numel() is global

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    def asynchronous_save(accelerator, folder: str) -> tuple[float, float]:
        """(blocked, durable) seconds of one asynchronous save, the slowest rank's."""
        accelerator.project_configuration.async_save = True
        dist.barrier()
        accelerator.save_state(folder)
        accelerator.checkpointer.flush()
        accelerator.project_configuration.async_save = False
        writer = accelerator.checkpointer.writer
        return slowest(writer.last_blocked_s), slowest(writer.last_durable_s)

    def timed(function) -> float:
        dist.barrier()
        start = time.perf_counter()
        function()
        dist.barrier()
        return time.perf_counter() - start

    for repeat in range(args.repeats):
        for mode, (accelerator, model, optimizer) in runs.items():
            folder = str(root / f"{mode}_{repeat}")
            baseline = str(root / f"{mode}_{repeat}_baseline")
            save_s = timed(lambda: accelerator.save_state(folder))
            load_s = timed(lambda: accelerator.load_state(folder))
            unverified_s = timed(lambda: accelerator.load_state(folder, verify_checksums=False))
            if mode == "SHARDED_STATE_DICT":
                def baseline_save():
                    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)},
                             checkpoint_id=baseline)

                def baseline_load():
                    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
                    dcp.load(state, checkpoint_id=baseline)
            else:
                full = StateDictOptions(full_state_dict=True, cpu_offload=True)

                def baseline_save():
                    weights = get_model_state_dict(model, options=full)
                    optim = get_optimizer_state_dict(model, optimizer, options=full)
                    if dist.get_rank() == 0:
                        os.makedirs(baseline, exist_ok=True)
                        save_file({k: v.contiguous() for k, v in weights.items()}, f"{baseline}/model.safetensors")
                        tensors = {f"{n}/{k}": v for n, s in optim["state"].items() for k, v in s.items()}
                        save_file(tensors, f"{baseline}/optimizer.safetensors")

                baseline_load = None
            async_blocked_s, async_durable_s = asynchronous_save(accelerator, folder + "_async")
            base_save_s = timed(baseline_save)
            base_load_s = timed(baseline_load) if baseline_load else None
            if dist.get_rank() == 0:
                record = {"benchmark": "checkpoint_io", "format": "sharded" if mode.startswith("SHARDED") else "full",
                          "repeat": repeat, "processes": dist.get_world_size(), "parameters": parameters,
                          "save_s": round(save_s, 2), "load_s": round(load_s, 2), "load_without_checksums_s": round(unverified_s, 2),
                          "size_mb": round(_folder_bytes(folder) / 2**20, 1),
                          "baseline_save_s": round(base_save_s, 2),
                          "baseline_load_s": None if base_load_s is None else round(base_load_s, 2),
                          "async_blocked_s": round(async_blocked_s, 3), "async_durable_s": round(async_durable_s, 2),
                          "async_blocked_ratio": round(async_blocked_s / save_s, 3),
                          "save_ratio": round(save_s / base_save_s, 2),
                          "load_ratio": None if base_load_s is None else round(load_s / base_load_s, 2)}
                print(json.dumps(record), flush=True)
                shutil.rmtree(folder, ignore_errors=True)
                shutil.rmtree(folder + "_async", ignore_errors=True)
                shutil.rmtree(baseline, ignore_errors=True)
            dist.barrier()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        args.dir = scratch
        return _launch(args)


if __name__ == "__main__":
    sys.exit(main())
