"""One run of the GPU benchmark (see gpu_training.py): one loop, one model, one process; prints one JSON line.

Loops: ``hand`` (plain PyTorch: pinned memory, non-blocking copies, autocast, and with ``--fsdp`` a
hand-written ``fully_shard`` per block + root with a bf16 ``MixedPrecisionPolicy``), ``accelerator``
(trainkit's engine), ``trainer`` (trainkit.Trainer) and ``hf_trainer`` (transformers.Trainer, when
accelerate is installed beside it). Every loop builds the same model from a config (same seed) and
trains on the same random tokens; steps are timed after warm-up with CUDA events around the loop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings

import torch
from torch import nn

SHAPES = {  # model name -> (config builder, sequence length, per-device batch)
    "gpt2-small": ("gpt2", 1024, 8),
    "bert-base": ("bert", 128, 64),
    "gpt2-tiny": ("gpt2-tiny", 64, 4),  # CPU smoke test of the harness itself
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", required=True, choices=["hand", "accelerator", "trainer", "hf_trainer"])
    parser.add_argument("--model", default="gpt2-small", choices=sorted(SHAPES))
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    return parser.parse_args()


def build_model(name: str) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    kind = SHAPES[name][0]
    if kind == "bert":
        return BertForSequenceClassification(BertConfig())
    if kind == "gpt2-tiny":
        return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=128))
    return GPT2LMHeadModel(GPT2Config())


def batches(name: str, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` CPU batches of random tokens (labels = inputs for GPT-2, a class for BERT)."""
    kind, length, batch = SHAPES[name]
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(5, 30000 if kind != "gpt2-tiny" else 1000, (batch, length), generator=generator)
        labels = torch.randint(0, 2, (batch,), generator=generator) if kind == "bert" else ids.clone()
        out.append({"input_ids": ids, "labels": labels})
    return out


class SyncCounter:
    """Counts host-device synchronisations (torch's sync debug mode, as warnings) inside ``counting()``."""

    def __init__(self) -> None:
        self.count = 0

    @contextlib.contextmanager
    def counting(self):
        if not torch.cuda.is_available():
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.count += sum("synchroniz" in str(w.message) for w in caught)


def hand_loop(args: argparse.Namespace, model: nn.Module, data: list) -> tuple[callable, torch.device]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    if args.fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        model.to(device)
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in model.modules():
            if type(block).__name__ in (model._no_split_modules or []):
                if args.compile:
                    block.compile()
                fully_shard(block, mp_policy=policy, reshard_after_forward=False)
        fully_shard(model, mp_policy=policy, reshard_after_forward=False)
        autocast = contextlib.nullcontext
    else:
        model.to(device)
        if args.compile:
            model.compile()
        autocast = lambda: torch.autocast(device.type, dtype=dtype)  # noqa: E731
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    pinned = [{k: v.pin_memory() if device.type == "cuda" else v for k, v in b.items()} for b in data]

    def step(index: int) -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in pinned[index % len(pinned)].items()}
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, device


def accelerator_loop(args: argparse.Namespace, model: nn.Module, data: list) -> tuple[callable, torch.device]:
    from torch.utils.data import DataLoader

    from trainkit import Accelerator, FullyShardedDataParallelPlugin
    from trainkit.utils import TorchDynamoPlugin

    accelerator = Accelerator(mixed_precision="bf16",
                              fsdp_plugin=FullyShardedDataParallelPlugin() if args.fsdp else None,
                              dynamo_plugin=TorchDynamoPlugin(backend="inductor", use_regional_compilation=args.fsdp)
                              if args.compile else None)
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-5, fused=accelerator.device.type == "cuda"))
    loader = accelerator.prepare(DataLoader(data, batch_size=None))
    iterator = iter(_forever(loader))

    def step(index: int) -> None:
        loss = model(**next(iterator)).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, accelerator.device


def _forever(loader):
    while True:
        yield from loader


def trainer_run(args: argparse.Namespace, model: nn.Module, data: list, hf: bool) -> dict:
    """Run a Trainer for warmup + steps; the step times come from a callback with CUDA syncs at its edges."""
    if hf:
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from trainkit import Trainer, TrainerCallback, TrainingArguments
    samples = [{k: v[i] for k, v in b.items()} for b in data for i in range(len(b["input_ids"]))]
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

    settings = dict(output_dir="/tmp/gpu-bench-trainer", per_device_train_batch_size=SHAPES[args.model][2],
                    max_steps=args.warmup + args.steps, bf16=True, logging_steps=10_000, save_strategy="no",
                    report_to="none", disable_tqdm=True, max_grad_norm=1.0, optim="adamw_torch_fused"
                    if torch.cuda.is_available() else "adamw_torch", torch_compile=args.compile,
                    dataloader_pin_memory=True, learning_rate=1e-5)
    if args.fsdp:
        settings.update(fsdp="full_shard auto_wrap")
    trainer = Trainer(model=model, args=TrainingArguments(**settings), train_dataset=samples, callbacks=[Clock()])
    trainer.train()
    timed = marks[args.warmup:]
    return {"step_s": (timed[-1] - timed[0]) / max(len(timed) - 1, 1)}


def main() -> None:
    args = parse_args()
    model = build_model(args.model)
    params = sum(p.numel() for p in model.parameters())
    data = batches(args.model, 8)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    syncs = SyncCounter()
    if args.loop in ("trainer", "hf_trainer"):
        result = trainer_run(args, model, data, hf=args.loop == "hf_trainer")
    else:
        step, device = (hand_loop if args.loop == "hand" else accelerator_loop)(args, model, data)
        for index in range(args.warmup):
            step(index)
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        synchronize()
        with syncs.counting():
            step(args.warmup)
        started = time.perf_counter()
        for index in range(args.steps):
            step(index)
        synchronize()
        result = {"step_s": (time.perf_counter() - started) / args.steps, "syncs_per_step": syncs.count}
    _, length, batch = SHAPES[args.model]
    result.update(loop=args.loop, model=args.model, compile=args.compile, fsdp=args.fsdp, params=params,
                  samples_per_s=batch / result["step_s"], tokens_per_step=batch * length,
                  peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
