"""DeepSpeed configs on 2 gloo ranks (CPU): each ZeRO stage against DDP, and what each rank holds.

Run as ``torchrun --nproc_per_node 2 deepspeed_runs.py OUT``. Every variant trains the tiny BERT of
fsdp_common for 10 steps on the same per-rank batches with a DeepSpeed config written as users write
them (JSON with "auto"), and records per-step losses and the bytes of parameters, gradients and optimizer
state this rank holds. The Trainer variant runs ``TrainingArguments(deepspeed=<the same JSON>)``.
Rank 0 writes OUT/deepspeed.json for tests/engine/strategies/test_deepspeed_processes.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_common import BATCH, batch, build_bert, gather_floats, max_difference, train, write_results  # noqa: E402

from trainkit import Accelerator  # noqa: E402
from trainkit.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler  # noqa: E402

STEPS = 10


def config(stage: int, offload: bool = False) -> dict:
    """A DeepSpeed config as users write it: everything the Accelerator knows left "auto"."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto",
            "stage3_gather_16bit_weights_on_model_save": True}
    if offload:
        zero.update(offload_optimizer={"device": "cpu", "pin_memory": True},
                    offload_param={"device": "cpu", "pin_memory": True})
    return {"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "wall_clock_breakdown": False}


def local_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        if tensor is not None:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            total += local.numel() * local.element_size()
    return total


def held_bytes(model, optimizer) -> dict[str, int]:
    """What this rank holds: parameters, gradients and optimizer state (its shards only)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    state = getattr(inner, "optim", inner).state  # ZeroRedundancyOptimizer keeps its shard's state in .optim
    return {"params": local_bytes(model.parameters()), "grads": local_bytes(p.grad for p in model.parameters()),
            "optimizer": local_bytes(v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor))}


def accelerator_run(stage: int | None, offload: bool = False) -> dict:
    def make() -> Accelerator:
        return Accelerator(deepspeed_plugin=None if stage is None else DeepSpeedPlugin(hf_ds_config=config(stage, offload)))

    run = train(make, steps=STEPS, clip=None)
    model, optimizer = run.model, run.optimizer
    # keep the gradients of one more step for the byte count (zero_grad frees them)
    data = batch(STEPS, run.accelerator.process_index)
    run.accelerator.backward(model(**data).loss)
    held = held_bytes(model, optimizer)
    optimizer.zero_grad()
    return {"losses": run.losses, "held": held, "distributed_type": run.accelerator.distributed_type.value,
            "strategy": type(run.accelerator.strategy).__name__}


def optimizer_blocks_run() -> dict:
    """A config with optimizer and scheduler blocks: DummyOptim/DummyScheduler, as Accelerate's examples."""
    ds = config(3)
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": [0.9, 0.999]}}
    ds["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto",
                                                            "warmup_num_steps": 3, "total_num_steps": "auto"}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds))
    model = build_bert()
    optimizer = DummyOptim(model.parameters(), lr=1e-3, weight_decay=0.0)
    scheduler = DummyScheduler(optimizer, total_num_steps=STEPS, warmup_num_steps=3)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for step in range(STEPS):
        loss = model(**batch(step, accelerator.process_index)).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    return {"optimizer": type(optimizer.optimizer).__name__, "lrs": lrs}


def checkpoint_roundtrip(stage: int, folder: Path) -> float:
    """save_state after 3 steps, load it into a fresh run: the next step's loss must be the uninterrupted one's."""
    import torch

    def make():
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
        model = build_bert()
        return (accelerator, *accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3)))

    def step(accelerator, model, optimizer, index):
        loss = model(**batch(index, accelerator.process_index)).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    accelerator, model, optimizer = make()
    for index in range(3):
        step(accelerator, model, optimizer, index)
    accelerator.save_state(str(folder))
    expected = [step(accelerator, model, optimizer, index) for index in (3, 4)]
    accelerator, model, optimizer = make()
    accelerator.load_state(str(folder))
    resumed = [step(accelerator, model, optimizer, index) for index in (3, 4)]
    return max(gather_floats(max_difference(expected, resumed)))


def trainer_runs(out: Path) -> dict:
    """The Trainer with and without TrainingArguments(deepspeed=<stage 3 JSON path>)."""
    import json

    from trainkit import Trainer, TrainingArguments

    path = out / "ds_config.json"
    path.write_text(json.dumps(config(3)))
    samples = [{k: v[i] for k, v in batch(step, rank).items()} for step in range(STEPS) for rank in (0, 1)
               for i in range(BATCH)]
    results = {}
    for name, deepspeed in (("plain", None), ("deepspeed", str(path))):
        args = TrainingArguments(output_dir=str(out / name), per_device_train_batch_size=BATCH, max_steps=STEPS,
                                 learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, report_to="none",
                                 save_strategy="no", disable_tqdm=True, max_grad_norm=1.0, seed=0,
                                 deepspeed=deepspeed, dataloader_drop_last=True)
        trainer = Trainer(model=build_bert(), args=args, train_dataset=samples)
        trainer.train()
        results[name] = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        results[f"{name}_type"] = trainer.accelerator.distributed_type.value
    return results


def main() -> None:
    out = Path(sys.argv[1])
    results: dict = {"ddp": accelerator_run(None)}
    for name, stage, offload in (("zero0", 0, False), ("zero1", 1, False), ("zero2", 2, False), ("zero3", 3, False),
                                 ("zero3_offload", 3, True)):
        results[name] = accelerator_run(stage, offload)
        results[name]["loss_diff"] = max(gather_floats(max_difference(results[name]["losses"],
                                                                      results["ddp"]["losses"])))
    results["blocks"] = optimizer_blocks_run()
    results["checkpoint"] = {str(stage): checkpoint_roundtrip(stage, out / f"ckpt{stage}") for stage in (1, 3)}
    results["trainer"] = trainer_runs(out)
    write_results(out, "deepspeed", results)


if __name__ == "__main__":
    main()
