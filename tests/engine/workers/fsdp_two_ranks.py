"""FSDP2 checks on 2 gloo ranks, one launch: every strategy against DDP, options, state dicts, DCP save.

Run under ``torch.distributed.run --nproc_per_node 2 fsdp_two_ranks.py OUT HANDOFF_JSON``. Rank 0 writes
``OUT/two_ranks.json`` (numbers the pytest side asserts on) and ``OUT/dcp`` + references for the load
workers (1 and 4 ranks).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_common import (build_bert, flatten_optimizer_state, gather_floats, max_difference, state_difference, train,
                         update_difference, write_results)
from safetensors.torch import save_file
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
from torch.distributed.tensor import DTensor

from trainkit import Accelerator, FullyShardedDataParallelPlugin
from trainkit.config import LAUNCH_CONFIG_ENV
from trainkit.engine.strategies.fsdp.sharding import local_numel

OUT, HANDOFF = Path(sys.argv[1]), sys.argv[2]
results: dict[str, dict] = {}
INITIAL = {key: value.clone() for key, value in build_bert().state_dict().items()}  # every run starts from these


def plugin(**kwargs) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(**kwargs)


def fsdp(mixed_precision: str = "no", accumulation: int = 1, **kwargs):
    return lambda: Accelerator(mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation,
                               fsdp_plugin=plugin(**kwargs))


def ddp(mixed_precision: str = "no", accumulation: int = 1):
    return lambda: Accelerator(mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation)


def describe(run, reference, name: str, **extra) -> None:
    """Record how ``run`` compares with ``reference`` (losses, norms, final full weights, sharding)."""
    params = list(run.model.parameters())
    full = run.accelerator.get_state_dict(run.model)  # default: rank 0 only, on CPU
    entry = {
        "loss_diff": max(gather_floats(max_difference(run.losses, reference.losses))),
        "norm_diff": max(gather_floats(max_difference(run.grad_norms, reference.grad_norms))),
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_fraction": local_numel(params) / sum(p.numel() for p in params),
        "devices": sorted({p.to_local().device.type if isinstance(p, DTensor) else p.device.type for p in params}),
        "distributed_type": run.accelerator.distributed_type.value,
        "rank1_state_dict_empty": gather_floats(len(full) == 0)[-1],
        "optimizer_params_are_model_params": all(
            any(q is p for p in params) for group in run.optimizer.param_groups for q in group["params"]),
        "losses": run.losses[:3],
        **extra,
    }
    if run.accelerator.is_main_process:
        entry["state_diff"] = state_difference(full, reference.full_state)
        entry["update_diff"] = update_difference(full, reference.full_state, INITIAL)
    results[name] = entry


def main() -> None:
    started = time.perf_counter()
    reference = train(ddp(), clip=1.0)
    reference.full_state = reference.accelerator.get_state_dict(reference.model)
    results["ddp"] = {"distributed_type": reference.accelerator.distributed_type.value, "losses": reference.losses[:3]}
    if reference.accelerator.is_main_process:  # the effects the tolerances guard: how much the run moves
        results["effect"] = {"weight_change": state_difference(reference.full_state, INITIAL),
                             "loss_change": max(reference.losses) - min(reference.losses)}

    full_shard = train(fsdp(sharding_strategy="FULL_SHARD"), clip=1.0)
    describe(full_shard, reference, "FULL_SHARD")
    describe(train(fsdp(sharding_strategy="SHARD_GRAD_OP"), clip=1.0, optimizer_before=False), reference, "SHARD_GRAD_OP")
    describe(train(fsdp(sharding_strategy=3), clip=1.0), reference, "NO_SHARD")
    describe(train(fsdp(sharding_strategy="full_shard", cpu_offload=True), clip=1.0), reference, "offload")
    describe(train(fsdp(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=20_000, activation_checkpointing=True,
                        forward_prefetch=True, backward_prefetch="NO_PREFETCH"), clip=1.0), reference, "size_wrap_ac")
    describe(train(fsdp(auto_wrap_policy="NO_WRAP", backward_prefetch="BACKWARD_POST"), clip=1.0), reference, "no_wrap")

    accumulated_ddp = train(ddp(accumulation=2), steps=10, clip=1.0)
    accumulated_ddp.full_state = accumulated_ddp.accelerator.get_state_dict(accumulated_ddp.model)
    describe(train(fsdp(accumulation=2), steps=10, clip=1.0), accumulated_ddp, "accumulation")

    bf16_ddp = train(ddp("bf16"))
    bf16_ddp.full_state = bf16_ddp.accelerator.get_state_dict(bf16_ddp.model)
    describe(train(fsdp("bf16")), bf16_ddp, "bf16")
    fp16_ddp = train(ddp("fp16"))
    fp16_ddp.full_state = fp16_ddp.accelerator.get_state_dict(fp16_ddp.model)
    fp16 = train(fsdp("fp16"))
    describe(fp16, fp16_ddp, "fp16", scaler=type(fp16.accelerator.scaler).__name__)

    check_state_dict_configs(reference)
    check_ignored_modules()
    check_rank0_loading(reference)
    check_launcher_yaml(bf16_ddp)
    save_sharded_checkpoint(full_shard)
    results["timing"] = {"seconds": time.perf_counter() - started}
    write_results(OUT, "two_ranks", results)


def check_state_dict_configs(reference) -> None:
    """torch's FullStateDictConfig(rank0_only=False) gives full tensors on every rank."""
    every_rank = plugin(state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False))
    run = train(lambda: Accelerator(fsdp_plugin=every_rank), clip=1.0)
    full = run.accelerator.get_state_dict(run.model)
    mine = state_difference(full, reference.full_state) if run.accelerator.is_main_process else None
    sizes = gather_floats(sum(t.numel() for t in full.values()))
    results["rank0_only_false"] = {"sizes": sizes, "state_diff": mine,
                                   "state_dict_type": every_rank.state_dict_type}
    check_optim_state_dict_config(run)


def check_optim_state_dict_config(run) -> None:
    """optim_state_dict_config acts on the strategy's full optimizer state dict: every rank, or rank 0 on CPU."""
    strategy = run.accelerator.strategy

    def described() -> dict:
        state = strategy.optimizer_state_dict(run.model, run.optimizer, full=True)
        tensors = [value for entry in state.get("state", {}).values() for value in entry.values()
                   if isinstance(value, torch.Tensor) and value.dim() > 0]
        return {"tensors": gather_floats(len(tensors)),
                "devices": gather_floats(sorted({tensor.device.type for tensor in tensors}))}

    every_rank = described()  # the plugin's FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)
    strategy.plugin.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
    try:
        rank0_only = described()
    finally:
        strategy.plugin.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)
    results["optim_state_dict_config"] = {"every_rank": every_rank, "rank0_only": rank0_only}


def check_ignored_modules() -> None:
    """Parameters of ignored modules stay plain tensors, everything else is sharded, and training runs."""
    model = build_bert()
    run = train(lambda: Accelerator(fsdp_plugin=plugin(ignored_modules=[model.classifier])), model=model, steps=3)
    results["ignored_modules"] = {
        "classifier_plain": not isinstance(run.model.classifier.weight, DTensor),
        "encoder_sharded": isinstance(run.model.bert.encoder.layer[0].output.dense.weight, DTensor),
        "finite": all(loss == loss for loss in run.losses),
    }


def check_rank0_loading(reference) -> None:
    """sync_module_states fixes ranks built differently; cpu_ram_efficient_loading fills meta ranks."""
    rank = dist.get_rank()
    initial = build_bert().state_dict()
    for name, model, options in (
        ("sync_module_states", build_bert(seed=rank), {"sync_module_states": True}),
        ("cpu_ram_efficient_loading", build_bert(device="meta" if rank else None),
         {"cpu_ram_efficient_loading": True, "sync_module_states": True}),
    ):
        accelerator = Accelerator(fsdp_plugin=plugin(**options))
        prepared = accelerator.prepare(model)
        full = accelerator.get_state_dict(prepared)
        buffers_equal = all(torch.equal(buffer, initial[name_].to(buffer.device))
                            for name_, buffer in prepared.named_buffers() if name_ in initial)
        position_ids = prepared.bert.embeddings.position_ids
        entry = {"buffers_equal": min(gather_floats(float(buffers_equal))),
                 "position_ids_ok": min(gather_floats(float(torch.equal(position_ids.cpu(), torch.arange(position_ids.shape[-1])[None]))))}
        if accelerator.is_main_process:
            entry["state_diff"] = state_difference(full, initial)
        run = train(lambda a=accelerator: a, model=prepared, clip=1.0)
        entry["loss_diff"] = max(gather_floats(max_difference(run.losses, reference.losses)))
        results[name] = entry
    check_rank0_loading_with_ignored_modules(initial)


def check_rank0_loading_with_ignored_modules(initial: dict[str, torch.Tensor]) -> None:
    """cpu_ram_efficient_loading also fills an ignored module (left whole, not sharded) on meta ranks."""
    model = build_bert(device="meta" if dist.get_rank() else None)
    accelerator = Accelerator(fsdp_plugin=plugin(cpu_ram_efficient_loading=True, ignored_modules=[model.classifier]))
    prepared = accelerator.prepare(model)
    classifier = prepared.classifier.weight
    full = accelerator.get_state_dict(prepared)
    entry = {"classifier_plain": min(gather_floats(float(not isinstance(classifier, DTensor)))),
             "classifier_equal": min(gather_floats(float(torch.equal(classifier.detach().cpu(),
                                                                     initial["classifier.weight"]))))}
    if accelerator.is_main_process:
        entry["state_diff"] = state_difference(full, initial)
    results["rank0_loading_ignored_modules"] = entry


def check_launcher_yaml(bf16_reference) -> None:
    """The issue's YAML, resolved by the launcher's loader, drives ``Accelerator()`` with no arguments."""
    os.environ[LAUNCH_CONFIG_ENV] = HANDOFF
    try:
        run = train(Accelerator, steps=5)
    finally:
        os.environ.pop(LAUNCH_CONFIG_ENV)
    strategy = run.accelerator.strategy
    params = list(run.model.parameters())
    results["launcher_yaml"] = {
        "distributed_type": run.accelerator.distributed_type.value,
        "mixed_precision": run.accelerator.mixed_precision,
        "sharding_strategy": strategy.options.sharding_strategy,
        "state_dict_type": strategy.options.state_dict_type,
        "backward_prefetch": strategy.options.backward_prefetch,
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_fraction": local_numel(params) / sum(p.numel() for p in params),
        "param_dtype": str(params[0].dtype),
        "loss_diff": max(gather_floats(max_difference(run.losses, bf16_reference.losses[:5]))),
        "device": str(run.accelerator.device),
    }


def save_sharded_checkpoint(run) -> None:
    """DCP-save the FULL_SHARD run's model and optimizer; rank 0 also writes full references."""
    strategy, model, optimizer = run.accelerator.strategy, run.model, run.optimizer
    started = time.perf_counter()
    dcp.save({"model": strategy.model_state_dict(model), "optimizer": strategy.optimizer_state_dict(model, optimizer)},
             checkpoint_id=str(OUT / "dcp"))
    full_model = strategy.full_state_dict(model)
    full_optimizer = strategy.optimizer_state_dict(model, optimizer, full=True)
    if dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in full_model.items()}, str(OUT / "reference_model.safetensors"))
        save_file(flatten_optimizer_state(full_optimizer), str(OUT / "reference_optimizer.safetensors"))
    results["dcp_save"] = {"seconds": time.perf_counter() - started, "sharded": strategy.sharded_checkpoints}


if __name__ == "__main__":
    main()
