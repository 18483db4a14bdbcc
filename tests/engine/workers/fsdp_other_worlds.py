"""FSDP2 checks on 1 process (no launcher) or 4 gloo ranks: hybrid strategies, and resharding a DCP checkpoint.

``python fsdp_other_worlds.py OUT`` (one process) or ``torch.distributed.run --nproc_per_node 4 ... OUT``.
Needs ``OUT/dcp`` and the references written by ``fsdp_two_ranks.py`` (saved on 2 ranks). Rank 0 writes
``OUT/world_<N>.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from fsdp_common import build_bert, flatten_optimizer_state, gather_floats, max_difference, train, write_results
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from trainkit import Accelerator, FullyShardedDataParallelPlugin
from trainkit.engine.strategies.fsdp.sharding import local_numel

OUT = Path(sys.argv[1])
results: dict[str, dict] = {}


def fsdp(**kwargs):
    return lambda: Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs))


def compare(run, reference, name: str) -> None:
    params = list(run.model.parameters())
    mesh = params[0].device_mesh
    results[name] = {
        "loss_diff": max(gather_floats(max_difference(run.losses, reference.losses[:len(run.losses)]))),
        "norm_diff": max(gather_floats(max_difference(run.grad_norms, reference.grad_norms[:len(run.grad_norms)]))),
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_fraction": local_numel(params) / sum(p.numel() for p in params),
        "mesh_shape": list(mesh.shape),
        "mesh_dims": list(mesh.mesh_dim_names or []),
        "world_size": run.accelerator.num_processes,
    }


def load_sharded_checkpoint() -> None:
    """Load the 2-rank DCP checkpoint into a fresh FULL_SHARD model and optimizer on this world size."""
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD"))
    model = build_bert(seed=7)  # different weights: everything must come from the checkpoint
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    strategy = accelerator.strategy
    started = time.perf_counter()
    state = {"model": strategy.model_state_dict(model), "optimizer": strategy.optimizer_load_target(model, optimizer)}
    dcp.load(state, checkpoint_id=str(OUT / "dcp"))
    strategy.load_model_state_dict(model, state["model"])
    strategy.load_optimizer_state_dict(model, optimizer, state["optimizer"])
    seconds = time.perf_counter() - started
    full_model = strategy.full_state_dict(model, rank0_only=False)
    full_optimizer = flatten_optimizer_state(strategy.optimizer_state_dict(model, optimizer, full=True))
    expected_model = load_file(str(OUT / "reference_model.safetensors"))
    expected_optimizer = load_file(str(OUT / "reference_optimizer.safetensors"))
    results["dcp_load"] = {
        "seconds": seconds,
        "model_keys_equal": sorted(full_model) == sorted(expected_model),
        "model_identical": min(gather_floats(float(all(
            torch.equal(full_model[k].cpu(), expected_model[k]) for k in expected_model if k in full_model)))),
        "optimizer_keys_equal": sorted(full_optimizer) == sorted(expected_optimizer),
        "optimizer_identical": min(gather_floats(float(all(
            torch.equal(full_optimizer[k].cpu(), expected_optimizer[k]) for k in expected_optimizer
            if k in full_optimizer)))),
    }


def gpu_bf16() -> None:
    """One CUDA device, world size 1: FSDP2 with bf16 against the single-device bf16 loop."""
    reference = train(lambda: Accelerator(mixed_precision="bf16"), clip=1.0)
    run = train(lambda: Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin()), clip=1.0)
    compare(run, reference, "gpu_bf16")
    results["gpu_bf16"]["device"] = str(run.accelerator.device)
    write_results(OUT, "gpu", results)


def main() -> None:
    if "--gpu-bf16" in sys.argv:
        return gpu_bf16()
    started = time.perf_counter()
    reference = train(Accelerator, clip=1.0)  # DDP on 4 ranks, a single device on 1
    results["reference"] = {"distributed_type": reference.accelerator.distributed_type.value}
    world = reference.accelerator.num_processes
    if world == 1:
        compare(train(fsdp(sharding_strategy="FULL_SHARD"), clip=1.0), reference, "one_process_FULL_SHARD")
    else:
        compare(train(fsdp(sharding_strategy="HYBRID_SHARD", hybrid_shard_group_size=2), clip=1.0), reference,
                "HYBRID_SHARD")
        compare(train(fsdp(sharding_strategy="HYBRID_SHARD_ZERO2", hybrid_shard_group_size=2), clip=1.0,
                      optimizer_before=False), reference, "HYBRID_SHARD_ZERO2")
        # Default group size: the processes of one machine (all 4 here), so it shards like FULL_SHARD.
        compare(train(fsdp(sharding_strategy="HYBRID_SHARD"), steps=3), reference, "HYBRID_SHARD_one_machine")
        for strategy in ("HYBRID_SHARD", "NO_SHARD"):  # only rank 0 has weights: shards, then replicas, get them
            only_rank0 = build_bert(device="meta" if torch.distributed.get_rank() else None)
            compare(train(fsdp(sharding_strategy=strategy, hybrid_shard_group_size=2, cpu_ram_efficient_loading=True),
                          steps=5, clip=1.0, model=only_rank0), reference, f"{strategy}_rank0_loading")
    load_sharded_checkpoint()
    results["timing"] = {"seconds": time.perf_counter() - started}
    write_results(OUT, f"world_{world}", results)


if __name__ == "__main__":
    main()
