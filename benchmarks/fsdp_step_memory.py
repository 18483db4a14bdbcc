"""Peak tensor memory of one FSDP2 training step: trainkit vs a hand-written ``fully_shard`` loop, bf16.

Variants, each its own gloo launch (1 rank by default) in one invocation, the reference first:

- ``hand_written``: ``fully_shard`` per GPT2Block and on the root with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, no autocast, resharding after forward
  only where there is more than one process (as trainkit); forward with labels,
  ``loss.backward()``, ``AdamW.step()``, ``zero_grad()``.
- ``accelerator``: ``Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(
  sharding_strategy="FULL_SHARD", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
  transformer_cls_names_to_wrap=["GPT2Block"]))``; prepare, forward with labels, ``accelerator.backward``,
  step, zero_grad.
- ``trainer``: ``trainkit.Trainer`` with ``fsdp="full_shard auto_wrap"``, ``bf16=True``, no clipping
  (its optimizer is the Trainer's default AdamW, which may differ from the loops' plain ``AdamW``).

The model is a GPT-2 built from ``GPT2Config`` (no download; dropout 0). Every variant runs a few steps
and reports its last one (steady state: the optimizer state exists). Peaks are tensor bytes, not RSS:

- on CUDA, ``torch.cuda.max_memory_allocated``, reset at every phase mark;
- on CPU, the bytes the CPU allocator has handed out and not yet taken back, as ``torch.profiler``
  (``profile_memory=True``) records them at every allocation and free, storage resizes included
  ("Total Allocated" of each allocation event). The profiler runs from before the model is built, so the
  figure covers every tensor of the run. Phase marks are zero-length ``record_function`` ranges.

Phases of a step, marked by hooks, so the Trainer is measured like the loops: ``forward`` (the root
module's forward pre-hook to its forward hook; ``forward_end_bytes`` is what is live when it returns),
``backward`` (to the optimizer's step pre-hook: clipping and loss scaling included), ``step`` (the
optimizer step), then ``zero_grad`` up to the next forward. Prints one JSON line per variant with each
figure's ratio to ``hand_written``::

    .venv/bin/python benchmarks/fsdp_step_memory.py                       # 1 rank, 4 layers, 2 x 256 tokens
    .venv/bin/python benchmarks/fsdp_step_memory.py --procs 2 --variants accelerator
    python benchmarks/fsdp_step_memory.py --device cuda --layers 12 --batch 8 --seq 1024   # the GPU figure
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from launching import torchrun_command  # benchmarks/ is on sys.path: these files run as scripts

VARIANTS = ("hand_written", "accelerator", "trainer")
PHASES = ("forward", "backward", "step", "zero_grad")
MARK = "fsdp_step_memory:"
logger = logging.getLogger("fsdp_step_memory")


# -- measuring --------------------------------------------------------------------------------------
class CudaMeter:
    """Peaks between marks from the CUDA caching allocator's own counters."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.marks: list[tuple[str, int, int]] = []  # (name, peak since the previous mark, live bytes now)
        torch.cuda.reset_peak_memory_stats()

    def mark(self, name: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        self.marks.append((name, cuda.max_memory_allocated(), cuda.memory_allocated()))
        cuda.reset_peak_memory_stats()

    def finish(self) -> list[tuple[str, int, int]]:
        return self.marks


class CpuMeter:
    """Peaks between marks from the CPU allocator's live-byte count, as the profiler records it."""

    def __init__(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.torch = torch
        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.profiler.__enter__()

    def mark(self, name: str) -> None:
        with self.torch.profiler.record_function(MARK + name):
            pass

    def finish(self) -> list[tuple[str, int, int]]:
        """(name, peak since the previous mark, live bytes at the mark) for every mark, in order."""
        from torch._C._profiler import _EventType

        self.profiler.__exit__(None, None, None)
        timeline: list[tuple[int, int, Any]] = []  # (time, order, live bytes or mark name)
        stack = list(self.profiler.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
                timeline.append((event.start_time_ns, 1, event.extra_fields.total_allocated))
            elif event.name.startswith(MARK):
                timeline.append((event.start_time_ns, 0, event.name[len(MARK):]))
        timeline.sort(key=lambda item: (item[0], item[1]))
        marks, live, peak = [], 0, 0
        for _, _, value in timeline:
            if isinstance(value, str):
                marks.append((value, peak, live))
                peak = live
            else:
                live = value
                peak = max(peak, live)
        return marks


class CudaAutocastOnCpu:
    """A torch-function mode that gives CPU autocast CUDA's fp32 list for the ops GPT-2 and its loss use.

    CPU autocast keeps layer norm, ``pow`` (GPT-2's GELU), softmax and log-softmax in bf16; CUDA autocast
    runs them in fp32, which is where autocast costs memory on a GPU. With ``--cuda_autocast_on_cpu`` a
    CPU run casts those ops' inputs to fp32 wherever autocast is on, so the CPU figures show that cost.
    A diagnostic: the ops are the ones GPT-2 calls, not CUDA's whole list.
    """

    def __new__(cls) -> Any:
        import torch
        from torch.overrides import TorchFunctionMode

        fp32_ops = {torch.nn.functional.layer_norm, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__,
                    torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.log_softmax,
                    torch.nn.functional.log_softmax, torch.Tensor.log_softmax, torch.nn.functional.cross_entropy,
                    torch.nn.functional.nll_loss}

        def up(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
                return value.float()
            return value

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                kwargs = kwargs or {}
                if func in fp32_ops and torch.is_autocast_enabled("cpu"):
                    args, kwargs = [up(a) for a in args], {k: up(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)

        return Mode()


def install_marks(meter: CpuMeter | CudaMeter, model: Any) -> None:
    """Mark each phase of every step with hooks on the root module and on every optimizer's step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    model.register_forward_pre_hook(lambda *_: meter.mark("step_start"))
    model.register_forward_hook(lambda *_: meter.mark("forward_end"))
    register_optimizer_step_pre_hook(lambda *_: meter.mark("backward_end"))
    register_optimizer_step_post_hook(lambda *_: meter.mark("step_end"))


def last_step(marks: list[tuple[str, int, int]]) -> dict[str, int]:
    """Peak bytes per phase of the last complete step, the bytes live when forward returned, and the step's peak."""
    names = [name for name, _, _ in marks]
    start = len(names) - 1 - names[::-1].index("step_start")
    previous = names[:start][::-1]
    start_of_last = start - 1 - previous.index("step_start") if "step_start" in previous else None
    if start_of_last is None:
        raise RuntimeError("at least two steps are needed (the last one is reported, zero_grad included)")
    phase_of = {"forward_end": "forward", "backward_end": "backward", "step_end": "step", "step_start": "zero_grad"}
    figures: dict[str, int] = {}
    for name, peak, live in marks[start_of_last + 1:start + 1]:
        phase = phase_of[name]
        figures[f"{phase}_peak_bytes"] = max(peak, figures.get(f"{phase}_peak_bytes", 0))
        if name == "forward_end":
            figures["forward_end_bytes"] = live
    figures["step_start_bytes"] = marks[start_of_last][2]
    figures["peak_bytes"] = max(figures[f"{phase}_peak_bytes"] for phase in PHASES)
    return figures


# -- the workload -----------------------------------------------------------------------------------
def build_model(args: argparse.Namespace) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_positions=max(1024, args.seq), resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def batches(args: argparse.Namespace, device: Any, rank: int) -> list[Any]:
    import torch

    generator = torch.Generator().manual_seed(rank)
    return [torch.randint(0, 50257, (args.batch, args.seq), generator=generator).to(device)
            for _ in range(args.steps)]


def run_hand_written(args: argparse.Namespace, meter: CpuMeter | CudaMeter, device: Any) -> list[float]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (dist.get_world_size(),))
    model = build_model(args).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # On one process nothing is sharded, so the blocks keep their gathered parameters after forward (as the
    # issue's GPU loop and trainkit do); on several, they are freed and gathered again for backward.
    reshard = dist.get_world_size() > 1
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    install_marks(meter, model)
    losses = []
    for ids in batches(args, device, dist.get_rank()):
        outputs = model(input_ids=ids, labels=ids)  # alive until the next step's forward, as in a typical loop
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(outputs.loss.item())
    meter.mark("step_start")  # closes the last step's zero_grad phase
    return losses


def run_accelerator(args: argparse.Namespace, meter: CpuMeter | CudaMeter, device: Any) -> list[float]:
    import torch

    from trainkit import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["GPT2Block"])
    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin, cpu=device.type == "cpu")
    model = build_model(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    install_marks(meter, model)
    losses = []
    for ids in batches(args, accelerator.device, accelerator.process_index):
        outputs = model(input_ids=ids, labels=ids)
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(outputs.loss.item())
    meter.mark("step_start")
    return losses


def run_trainer(args: argparse.Namespace, meter: CpuMeter | CudaMeter, device: Any) -> list[float]:
    from trainkit import Trainer, TrainerCallback, TrainingArguments

    rows = [{"input_ids": ids, "labels": ids} for batch in batches(args, "cpu", int(os.environ.get("RANK", 0)))
            for ids in batch]
    losses: list[float] = []

    class MarkModel(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            install_marks(meter, model)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=args.batch, max_steps=args.steps, bf16=True,
            fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]},
            learning_rate=1e-4, max_grad_norm=0.0, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
            report_to=[], use_cpu=device.type == "cpu", dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=build_model(args), args=training_args, train_dataset=rows, callbacks=[MarkModel()])
        trainer.train()
    meter.mark("step_start")
    return losses


RUNNERS = {"hand_written": run_hand_written, "accelerator": run_accelerator, "trainer": run_trainer}


def worker(variant: str, args: argparse.Namespace) -> None:
    """One rank of one variant: measure, then rank 0 prints a RESULT line."""
    import torch
    import torch.distributed as dist

    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    meter = CudaMeter() if device.type == "cuda" else CpuMeter()
    with CudaAutocastOnCpu() if args.cuda_autocast_on_cpu else contextlib.nullcontext():
        losses = RUNNERS[variant](args, meter, device)
    figures = last_step(meter.finish())
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, figures)
    if dist.get_rank() == 0:
        worst = {key: max(f[key] for f in everyone) for key in figures}  # the largest rank's figure
        print("RESULT " + json.dumps({"variant": variant, "losses": [round(x, 4) for x in losses], **worst}),
              flush=True)
    dist.destroy_process_group()


def launch(variant: str, args: argparse.Namespace) -> dict:
    command = torchrun_command(args.procs, __file__, "--worker", variant, "--device", args.device, "--layers",
                               args.layers, "--batch", args.batch, "--seq", args.seq, "--steps", args.steps,
                               *(["--cuda_autocast_on_cpu"] if args.cuda_autocast_on_cpu else []))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.procs)))
    env.pop("TRAINKIT_LAUNCH_CONFIG", None)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"variant {variant!r} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--cuda_autocast_on_cpu", action="store_true",
                        help="CPU runs: autocast casts GPT-2's layer norm, pow and softmax to fp32 as CUDA's does")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    variants = ["hand_written"] + [v for v in args.variants if v != "hand_written"]  # ratios need the reference
    reference: dict | None = None
    setting = {"device": args.device, "cuda_autocast_on_cpu": args.cuda_autocast_on_cpu, "procs": args.procs, "layers": args.layers, "batch": args.batch, "seq": args.seq}
    for variant in variants:
        measured = launch(variant, args)
        reference = reference or measured
        for key in [k for k in measured if k.endswith("_bytes")]:
            measured[key.replace("_bytes", "_vs_hand_written")] = round(measured[key] / reference[key], 3)
        print(json.dumps({**setting, **measured}), flush=True)


if __name__ == "__main__":
    main()
