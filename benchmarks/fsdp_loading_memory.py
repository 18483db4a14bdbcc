"""Peak RSS per rank while loading and preparing a ~125M-parameter checkpoint under FSDP2, with and without
``cpu_ram_efficient_loading``.

A GPT-2-small-shaped checkpoint (GPT2Config defaults, 124M parameters, ~500 MB fp32) is generated once in
a temporary folder with ``save_pretrained``. Each mode is its own 2-rank gloo launch (peak RSS is per
process). Every rank measures its RSS after start-up (torch, transformers, process group: the "runtime"),
then builds an ``Accelerator``, calls ``from_pretrained`` and ``prepare``, and reports its peak RSS. The
target for rank 1 is ``runtime + its shard`` plus 15 %. A third mode loads with ``dtype=torch.bfloat16``,
a conversion that makes ``from_pretrained`` read every weight unless the rank builds on the meta device.
Prints one JSON line per mode::

    .venv/bin/python benchmarks/fsdp_loading_memory.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile

from launching import torchrun_command  # benchmarks/ is on sys.path: these files run as scripts

MiB = 2**20


def rss_mib() -> float:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(checkpoint: str, efficient: bool, dtype_name: str) -> None:
    """One rank: load + prepare, then rank 0 prints every rank's figures."""
    import torch
    import torch.distributed as dist
    from transformers import GPT2LMHeadModel

    from trainkit import Accelerator, FullyShardedDataParallelPlugin

    dist.init_process_group("gloo")
    runtime = rss_mib()
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            cpu_ram_efficient_loading=efficient, sync_module_states=efficient)
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = GPT2LMHeadModel.from_pretrained(checkpoint, dtype=getattr(torch, dtype_name))
    after_load = rss_mib()
    on_meta = model.transformer.h[0].mlp.c_fc.weight.is_meta
    total = sum(p.numel() * p.element_size() for p in model.parameters()) / MiB
    model = accelerator.prepare(model)
    shard = sum(p.to_local().numel() * p.element_size() for p in model.parameters()) / MiB
    figures = {"rank": dist.get_rank(), "runtime_mib": round(runtime), "peak_mib": round(peak_rss_mib()),
               "shard_mib": round(shard), "model_mib": round(total),
               "after_from_pretrained_mib": round(after_load), "built_on_meta": on_meta}
    figures["target_mib"] = round((runtime + shard) * 1.15)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, figures)
    if dist.get_rank() == 0:
        print(json.dumps({"benchmark": "fsdp_loading_memory", "cpu_ram_efficient_loading": efficient,
                          "dtype": dtype_name, "torch": torch.__version__, "ranks": gathered}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as folder:
        GPT2LMHeadModel(GPT2Config()).save_pretrained(folder)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
        modes = [(False, "float32"), (True, "float32"), (True, "bfloat16")]
        for efficient, dtype_name in modes[1:] if os.environ.get("ONLY_EFFICIENT") == "1" else modes:
            command = torchrun_command(2, __file__, "--worker", folder, str(int(efficient)), dtype_name)
            result = subprocess.run(command,
                                    capture_output=True, text=True, env=env, check=False)
            lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
            print(lines[-1] if lines else json.dumps({"error": result.stderr[-2000:]}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
    else:
        main()
