"""FSDP2 with ``FULL_STATE_DICT`` on 2 gloo processes (CPU): one synchronous and one asynchronous ``save_state``
of the same state, the asynchronous one gathered by the background writer while training moves on.

Rank 0 writes ``OUT/result.json``: each checkpoint's manifest checksums, the writer's staged bytes on each rank,
and whether the loop ran a collective on the training group while the writer gathered. The model has a layer
whose rows do not split evenly over 2 ranks (5 rows: 3 and 2) and a buffer (not sharded).
"""

from __future__ import annotations

import json
import sys
import threading

import torch
import torch.distributed as dist
from torch import nn

from trainkit import Accelerator, FullyShardedDataParallelPlugin
from trainkit.engine.checkpoint import read_manifest, sinks
from trainkit.engine.checkpoint import async_writer
from trainkit.utils.dataclasses import ProjectConfiguration


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 5)
        self.second = nn.Linear(5, 16)
        self.register_buffer("scale", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))) * self.scale.sum()


def main(out: str) -> None:
    torch.manual_seed(0)
    plugin = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin, project_config=ProjectConfiguration(project_dir=out))
    model = accelerator.prepare(Model())
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.1))

    def step() -> None:
        accelerator.backward(model(torch.randn(4, 8)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    step()
    accelerator.save_state(f"{out}/sync")
    # Hold rank 0's writer before it writes the gathered file: the loop takes steps (collectives on the training
    # group) meanwhile, so the gather on the writer's group runs while training goes on.
    gate = threading.Event()
    real_write = sinks.write_tensors_now
    in_writer = lambda: threading.current_thread().name == async_writer.WRITER_THREAD_NAME  # noqa: E731
    sinks.write_tensors_now = lambda *args: (gate.wait(60) if in_writer() else None, real_write(*args))
    accelerator.project_configuration.async_save = True
    folder = accelerator.save_state(f"{out}/async")
    staged = accelerator.checkpointer.writer.pool.nbytes
    for _ in range(3):
        step()  # changes every parameter: the checkpoint must hold the state as of save_state()
    gate.set()
    accelerator.end_training()
    staged_all = [None] * dist.get_world_size()
    dist.all_gather_object(staged_all, staged)
    if accelerator.is_main_process:
        checksums = {name: {k: v["sha256"] for k, v in read_manifest(f"{out}/{name}")["files"].items()}
                     for name in ("sync", folder.rsplit("/", 1)[-1])}
        json.dump({"checksums": checksums, "staged_bytes": staged_all}, open(f"{out}/result.json", "w"))


if __name__ == "__main__":
    main(sys.argv[1])
