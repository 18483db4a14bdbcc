"""bf16 FSDP2 on a tiny GPT-2 in one gloo process (CPU): output dtypes, where autocast is on, tracked memory.

Run under ``torch.distributed.run --nproc_per_node 1 fsdp_precision.py OUT``; writes ``OUT/precision.json``.
Memory is counted by torch's ``MemTracker`` (a dispatch mode counting live storages, storage resizes
included), for one steady-state step of trainkit's Accelerator and of a hand-written ``fully_shard`` loop
with the same bf16 policy, in this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

from trainkit import Accelerator, FullyShardedDataParallelPlugin

OUT = Path(sys.argv[1])
CONFIG = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=2048, n_positions=128, bos_token_id=0, eos_token_id=0,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
IDS = torch.randint(0, CONFIG.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(CONFIG)


def step_peak_bytes(model: torch.nn.Module, step) -> int:
    """Peak tracked bytes of one step after two warm-up steps (the optimizer state exists by then)."""
    step()
    step()
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def hand_written() -> int:
    model = gpt2()
    for block in model.transformer.h:  # one process: nothing to reshard, as trainkit decides
        fully_shard(block, mp_policy=BF16, reshard_after_forward=False)
    fully_shard(model, mp_policy=BF16, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        outputs = model(input_ids=IDS, labels=IDS)
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step_peak_bytes(model, step)


def trainkit_run(accelerator: Accelerator) -> dict:
    model = gpt2()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    autocast_seen: dict[str, bool] = {}
    def record(name: str):
        def hook(*unused) -> None:  # returns None: a forward hook's result would replace the output
            autocast_seen.setdefault(name, torch.is_autocast_enabled("cpu"))
        return hook

    model.transformer.h[0].mlp.register_forward_hook(record("block"))
    model.lm_head.register_forward_hook(record("lm_head"))
    outputs = model(input_ids=IDS, labels=IDS)
    dtypes = {"loss": str(outputs.loss.dtype), "logits": str(outputs.logits.dtype)}
    accelerator.backward(outputs.loss)
    optimizer.step()
    optimizer.zero_grad()
    del outputs

    def step() -> None:
        outputs = model(input_ids=IDS, labels=IDS)
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()

    policy = model.transformer.h[0]._get_fsdp_state()._mp_policy  # what fully_shard was given
    return {"dtypes": dtypes, "unit_reduce_dtype": str(policy.reduce_dtype), "autocast": autocast_seen, "peak_bytes": step_peak_bytes(model, step),
            "outside_forward_autocast": torch.is_autocast_enabled("cpu")}


def main() -> None:
    dist.init_process_group("gloo")
    results = {"hand_written_peak_bytes": hand_written()}
    plugin = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["GPT2Block"])
    results["bf16"] = trainkit_run(Accelerator(mixed_precision="bf16", fsdp_plugin=plugin))
    # A user's own policy is used as it is (here: gradients reduced in bf16).
    own = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    results["own_policy"] = trainkit_run(Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(
        auto_wrap_policy="TRANSFORMER_BASED_WRAP", mixed_precision_policy=own)))
    (OUT / "precision.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
