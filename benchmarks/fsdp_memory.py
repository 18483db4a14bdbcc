"""Per-rank memory of FSDP2 strategies vs hand-written DDP: parameter + gradient + optimizer-state bytes, peak RSS.

Each configuration runs as its own 2-rank gloo launch (peak RSS is per process, so runs must not share
one); the hand-written ``DistributedDataParallel`` loop is the reference and runs in the same invocation.
The model is a ~110M-parameter BertForSequenceClassification (BERT-base shape, built from a config).
Prints one JSON line per run (rank 0 reports the largest value over ranks)::

    .venv/bin/python benchmarks/fsdp_memory.py                 # ddp, full_shard, shard_grad_op, offload
    .venv/bin/python benchmarks/fsdp_memory.py --runs ddp full_shard --layers 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import time
from pathlib import Path

from launching import (
    torchrun_command,  # benchmarks/ is on sys.path: these files run as scripts
)

RUNS = {
    "ddp": None,  # hand-written torch DDP loop: the reference
    "full_shard": {"sharding_strategy": "FULL_SHARD"},
    "shard_grad_op": {"sharding_strategy": "SHARD_GRAD_OP"},
    "offload": {"sharding_strategy": "FULL_SHARD", "cpu_offload": True},
}
# DeepSpeed configs (docs/deepspeed.md): DeepSpeedPlugin fields, run on trainkit's DDP/FSDP2 engine.
DEEPSPEED_RUNS = {
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero3": {"zero_stage": 3},
    "zero3_offload": {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
}
RUNS.update(DEEPSPEED_RUNS)
logger = logging.getLogger("fsdp_memory")


def tensor_bytes(tensors) -> int:
    """Bytes this rank stores for ``tensors`` (a DTensor counts its local shard)."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def worker(run: str, args: argparse.Namespace) -> None:
    """One rank of one run: build, prepare, train a few steps, measure, report (rank 0 prints)."""
    import torch
    import torch.distributed as dist
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    rss_before_model = peak_rss_mb()
    config = BertConfig(num_hidden_layers=args.layers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    n_params = sum(p.numel() for p in model.parameters())
    if RUNS[run] is None:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        forward_model = model
    else:
        from trainkit import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin

        if run in DEEPSPEED_RUNS:
            accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(**RUNS[run]))
        else:
            accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**RUNS[run]))
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-5))
        forward_model = model
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    step_times, grad_bytes = [], 0
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=generator)
        labels = torch.randint(0, 2, (args.batch,), generator=generator)
        started = time.perf_counter()
        loss = forward_model(input_ids=ids, labels=labels).loss
        loss.backward()
        grad_bytes = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
        step_times.append(time.perf_counter() - started)
    inner = getattr(optimizer, "optimizer", optimizer)
    owned = getattr(inner, "optim", inner)  # ZeRO-1 (ZeroRedundancyOptimizer) keeps its shard's state in .optim
    state_tensors = [v for state in owned.state.values() for v in state.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0]
    measured = {
        "param_bytes": tensor_bytes(model.parameters()),
        "grad_bytes": grad_bytes,
        "optimizer_bytes": tensor_bytes(state_tensors),
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_model_mb": rss_before_model,
        "step_s": sorted(step_times)[len(step_times) // 2],
    }
    measured["total_bytes"] = measured["param_bytes"] + measured["grad_bytes"] + measured["optimizer_bytes"]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, measured)
    if rank == 0:
        worst = {key: max(m[key] for m in everyone) for key in measured}
        print("RESULT " + json.dumps({"run": run, "params": n_params, "ranks": dist.get_world_size(), **worst}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(run: str, args: argparse.Namespace) -> dict:
    """Start one 2-rank run of this script and return rank 0's measurements."""
    command = torchrun_command(args.procs, __file__, "--worker", run, "--layers", args.layers, "--steps", args.steps,
                               "--batch", args.batch, "--seq", args.seq)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if args.fixed_mmap_threshold:
        # glibc keeps freed heap memory mapped; a fixed mmap threshold returns large blocks to the OS, so
        # peak RSS shows what tensors really held rather than the allocator's retention.
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    env.pop("TRAINKIT_LAUNCH_CONFIG", None)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"run {run!r} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--layers", type=int, default=12, help="BERT layers (12: ~110M parameters)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--fixed_mmap_threshold", action="store_true",
                        help="run workers with MALLOC_MMAP_THRESHOLD_=65536 (RSS without glibc's heap retention)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs = ["ddp"] + [run for run in args.runs if run != "ddp"]  # the reference first: ratios need it
    reference = None
    for run in runs:
        measured = launch(run, args)
        reference = reference or measured
        measured["bytes_vs_ddp"] = round(measured["total_bytes"] / reference["total_bytes"], 3)
        measured["rss_vs_ddp"] = round(measured["peak_rss_mb"] / reference["peak_rss_mb"], 3)
        measured["step_vs_ddp"] = round(measured["step_s"] / reference["step_s"], 3)
        measured["fixed_mmap_threshold"] = args.fixed_mmap_threshold
        print(json.dumps(measured), flush=True)


if __name__ == "__main__":
    main()
