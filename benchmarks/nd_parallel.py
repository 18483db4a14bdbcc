"""Bytes per rank (parameters, gradients, optimizer state) and CPU step time: DDP4, FSDP4, FSDP2, TP2 x FSDP2, TP2 x DDP2.

One gloo launch per layout (4 processes; FSDP2: 2, the data degree of TP2 x FSDP2) trains a Llama-shaped model (hidden 512, 4 layers, 8 heads, vocab 4096,
~17M parameters, fp32, AdamW) for a few steps on one global batch of 8 x 128 tokens. After the last step each
rank counts the elements it holds (DTensor local shards) of the parameters, their gradients and AdamW's two
moments, in bytes; rank 0 prints the largest rank's figures and the median step time after a warm-up.
Prints one JSON line per layout::

    .venv/bin/python benchmarks/nd_parallel.py [--steps 6]

The step time on CPU measures gloo collectives and small matmuls on shared cores, not GPU behaviour: read it as
"what TP costs in communication here", not as a throughput forecast.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from launching import torchrun_command  # benchmarks/ is on sys.path: these files run as scripts

LAYOUTS = {  # name: (processes, ParallelismConfig degrees or None for plain DDP)
    "ddp4": (4, None),
    "fsdp4": (4, dict(dp_shard_size=4)),
    "fsdp2": (2, dict(dp_shard_size=2)),  # the data degree of TP2 x FSDP2, without TP
    "tp2_fsdp2": (4, dict(dp_shard_size=2, tp_size=2)),
    "tp2_ddp2": (4, dict(dp_replicate_size=2, tp_size=2)),
}
GLOBAL_BATCH, SEQ = 8, 128


def local_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def worker(layout: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainkit import Accelerator, ParallelismConfig

    degrees = LAYOUTS[layout][1]
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**degrees) if degrees else None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=SEQ))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    per_rank = GLOBAL_BATCH // accelerator.strategy.data_parallel_size
    ids = torch.randint(0, 4096, (per_rank, SEQ), generator=torch.Generator().manual_seed(accelerator.strategy.data_parallel_rank))
    times = []
    for step in range(steps):
        dist.barrier()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        times.append(time.perf_counter() - start)
        if step < steps - 1:  # the last step's gradients stay, to be counted
            optimizer.zero_grad()
    params = list(model.parameters())
    moments = [value for state in optimizer.state.values() for key, value in state.items() if key in ("exp_avg", "exp_avg_sq")]
    figures = torch.tensor([local_bytes(params), local_bytes(p.grad for p in params if p.grad is not None),
                            local_bytes(moments)], dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if accelerator.is_main_process:
        print(json.dumps({"layout": layout, "params_MiB": round(figures[0].item() / 2**20, 2),
                          "grads_MiB": round(figures[1].item() / 2**20, 2),
                          "optimizer_MiB": round(figures[2].item() / 2**20, 2),
                          "step_s_median": round(statistics.median(times[1:]), 4), "steps": steps}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    for layout in LAYOUTS:
        result = subprocess.run(torchrun_command(LAYOUTS[layout][0], __file__, "--worker", layout, "--steps", str(args.steps)),
                                capture_output=True, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not lines:
            print(result.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{layout} failed")
        print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
