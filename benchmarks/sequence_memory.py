"""Activation memory per rank against sequence length with 1, 2 and 4 sequence shards, and the longest sequence
that fits a fixed budget.

One launch per shard count: 1 (one process, no ParallelismConfig) or ``sp_size = shards`` (Ulysses sequence
parallelism, FSDP2 over the sp ranks; ``--dimension cp``: torch's ring attention, CUDA only). Each trains a
Llama-shaped model built from a config (hidden 64, 2 layers, 4 heads / 2 key-value heads, vocab 8192, fp32;
the logits of 8192 classes per token dominate its activations, as a real vocabulary does) on one sequence of
each length: forward with labels, backward. Per rank and per length:

* ``activation_mib``: the bytes of the tensors autograd keeps for backward (each storage once, parameters and
  FSDP's gathered copies of them excluded): the activations, exactly;
* ``peak_mib``: the highest tensor bytes during forward and backward minus those live before the forward: the
  activations plus every transient buffer (attention, the loss, gradients, FSDP's gathered parameters), from the
  CPU allocator (``torch.profiler`` allocation events, as ``fsdp_step_memory.py`` counts them) or, with
  ``--device cuda``, ``torch.cuda.max_memory_allocated``.

Rank 0 reports the largest rank. Then, for each shard count, the longest sequence whose peak fits
``--budget_mib``, to ``--granularity`` tokens, interpolated between the two measured lengths around the budget (the
peak grows linearly with the length: measured, it is). Lengths are measured in ascending order: on CPU the
allocator figures of a process that has already run a longer sequence carry some of its buffers (collectives'
scratch space), so a fresh, ascending series is the clean one. Prints one JSON line per measurement and one per
budget::

    .venv/bin/python benchmarks/sequence_memory.py                              # shards 1 2 4, CPU
    .venv/bin/python benchmarks/sequence_memory.py --shards 1 2 --lengths 1024 4096 --budget_mib 128
    python benchmarks/sequence_memory.py --device cuda --dimension cp --shards 1 2 --lengths 8192 32768

Memory figures do not depend on the machine's load; step times (``seconds``) do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from fsdp_step_memory import CpuMeter, CudaMeter  # benchmarks/ is on sys.path: these files run as scripts
from launching import torchrun_command

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = 8192, 64, 2, 4, 2


class SavedActivations:
    """Bytes autograd keeps for backward inside the block, each storage once, parameters excluded (the module's
    own, or the unsharded copies FSDP gathers for it: they are recorded as each module starts its forward)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.model, self.torch = model, torch
        self.storages: dict[int, int] = {}
        self.parameters: set[int] = set()

    def _note_parameters(self, module: Any, args: Any) -> None:
        for parameter in module.parameters(recurse=False):
            local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
            self.parameters.add(local.untyped_storage().data_ptr())

    def _pack(self, tensor: Any) -> Any:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self) -> SavedActivations:
        self.handles = [module.register_forward_pre_hook(self._note_parameters) for module in self.model.modules()]
        self.saving = self.torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self.saving.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.saving.__exit__(*exc)
        for handle in self.handles:
            handle.remove()

    @property
    def bytes(self) -> int:
        return sum(size for pointer, size in self.storages.items() if pointer not in self.parameters)


def measure(model: Any, length: int, device: Any, meter_class: type) -> tuple[int, int, float]:
    """(activation bytes, peak bytes, seconds) of one forward + backward on a ``length``-token sequence."""
    import gc

    import torch
    import torch.distributed as dist

    ids = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
    meter = meter_class()
    start = time.perf_counter()
    meter.mark("begin")
    with SavedActivations(model) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    meter.mark("forward")
    loss.backward()
    meter.mark("backward")
    seconds = time.perf_counter() - start
    # Free this step's tensors while the CPU meter still records: the profiler only subtracts the frees it sees,
    # so a tensor born in one measurement and freed after it (gradients, collectives' buffers released when their
    # work objects are collected) would inflate every later figure.
    del loss
    model.zero_grad(set_to_none=True)
    gc.collect()
    if dist.is_initialized():
        dist.barrier()
    meter.mark("end")
    marks = {name: (peak, live) for name, peak, live in meter.finish()}
    return saved.bytes, max(marks["forward"][0], marks["backward"][0]) - marks["begin"][1], seconds


def worker(args: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainkit import Accelerator, ParallelismConfig

    shards = args.shards[0]
    layout = ParallelismConfig(**{f"{args.dimension}_size": shards}) if shards > 1 else None
    accelerator = Accelerator(parallelism_config=layout, cpu=args.device == "cpu")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=1 << 20,
                         attn_implementation="sdpa")
    model = accelerator.prepare(LlamaForCausalLM(config))
    model.train()
    meter_class = CudaMeter if args.device == "cuda" else CpuMeter

    def largest(length: int) -> tuple[int, int, float]:
        measured = torch.tensor(measure(model, length, accelerator.device, meter_class), dtype=torch.float64)
        return tuple(accelerator.reduce(measured.to(accelerator.device), "max").tolist())  # type: ignore[return-value]

    def report(record: dict) -> None:
        if accelerator.is_main_process:
            print("RESULT " + json.dumps({"shards": shards, "dimension": args.dimension, "device": args.device,
                                          **record}), flush=True)

    largest(args.granularity * shards)  # warm-up: lazy initialisation is not an activation
    peaks = {}
    for length in sorted(args.lengths):  # ascending: the first measurements of a process are its cleanest
        activation, peak, seconds = largest(length)
        peaks[length] = peak
        report({"length": length, "activation_mib": round(activation / 2**20, 2), "peak_mib": round(peak / 2**20, 2),
                "seconds": round(seconds, 2)})
    if args.budget_mib:
        report({"budget_mib": args.budget_mib, "longest_length": longest(peaks, args.budget_mib * 2**20,
                                                                          args.granularity)})


def longest(peaks: dict[int, float], budget: float, granularity: int) -> int | None:
    """The longest multiple of ``granularity`` whose peak fits ``budget``, interpolated linearly between the
    measured lengths around the budget (peaks grow linearly with the length); None outside the measured range."""
    lengths = sorted(peaks)
    for short, long in zip(lengths, lengths[1:]):
        if peaks[short] <= budget < peaks[long]:
            fitting = short + (budget - peaks[short]) * (long - short) / (peaks[long] - peaks[short])
            return int(fitting) // granularity * granularity
    return None


def launch(shards: int, args: argparse.Namespace) -> list[dict]:
    options = ["--worker", "--shards", str(shards), "--dimension", args.dimension, "--device", args.device,
               "--granularity", str(args.granularity), "--budget_mib", str(args.budget_mib),
               "--lengths", *map(str, args.lengths)]
    command = torchrun_command(shards, __file__, *options)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("TRAINKIT_LAUNCH_CONFIG", None)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"shards={shards} failed:\n{done.stderr[-4000:]}")
    return [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--budget_mib", type=int, default=256, help="0: no budget search")
    parser.add_argument("--granularity", type=int, default=128, help="tokens: the budget's answer is a multiple")
    parser.add_argument("--dimension", choices=("sp", "cp"), default="sp")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    for shards in args.shards:
        for record in launch(shards, args):
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
