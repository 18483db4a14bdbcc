"""``save_state`` under ``if accelerator.is_main_process:`` on 2 gloo processes (CPU), as Accelerate allows for
unsharded training; and the same with a sharded (FSDP2) state, which must be refused, never hang.

DDP run: main-process-only saves, each followed by what scripts do next: ``wait_for_everyone()`` or training on
(the other process, waiting in the barrier or in the gradients' all-reduce, declines the save at once; the main
process saves alone), then a regular save on every process. Every process then loads each checkpoint. Rank 0
writes ``OUT/main_saves.json``: what each folder holds, whether loading restored the weights. FSDP run (``--fsdp``):
the main-process-only save raises a CheckpointError naming why; both processes go on. Each rank writes ``OUT/fsdp_rank{r}.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from trainkit import Accelerator, FullyShardedDataParallelPlugin
from trainkit.engine.checkpoint import CheckpointError
from trainkit.engine.checkpoint import rendezvous

OUT = Path(sys.argv[1])
FSDP = "--fsdp" in sys.argv
rendezvous.ALONE_AFTER_S = 30.0  # a decline must come at once: a wait this long would fail the test's timeout


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="[rank %(process)d] %(name)s: %(message)s")
    torch.manual_seed(0)
    plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT") if FSDP else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = accelerator.prepare(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.1))
    rank = accelerator.process_index

    def step() -> None:
        accelerator.backward(model(torch.randn(3, 4) + rank).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    step()
    if FSDP:
        outcome = "no error"
        if accelerator.is_main_process:
            try:
                accelerator.save_state(str(OUT / "fsdp"))
            except CheckpointError as error:
                outcome = str(error)
        accelerator.wait_for_everyone()
        step()  # both processes go on training
        (OUT / f"fsdp_rank{rank}.json").write_text(json.dumps({"outcome": outcome,
                                                                "exists": os.path.exists(OUT / "fsdp")}))
        return
    weights = {}
    for name, then in (("then_barrier", "barrier"), ("then_training", "train")):
        if accelerator.is_main_process:
            accelerator.save_state(str(OUT / name))
            weights[name] = [p.detach().clone() for p in model.parameters()]
        if then == "barrier":
            accelerator.wait_for_everyone()
        step()
    everyone = accelerator.save_state(str(OUT / "everyone"))  # every process again: a collective save
    accelerator.wait_for_everyone()
    restored = {}
    for name in ("then_barrier", "then_training"):
        accelerator.load_state(str(OUT / name))
        if accelerator.is_main_process:
            restored[name] = all(torch.equal(a, b) for a, b in zip(weights[name], model.parameters()))
    if accelerator.is_main_process:
        contents = {name: sorted(os.listdir(OUT / name)) for name in ("then_barrier", "then_training", "everyone")}
        (OUT / "main_saves.json").write_text(json.dumps({"restored": restored,
                                                         "contents": contents, "everyone": everyone}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
