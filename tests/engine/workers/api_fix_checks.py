"""Accelerate API names fixed for issue 23, in real processes: 2 gloo ranks on CPU under torchrun.

``reduce`` with every reduction Accelerate accepts, ``synchronize_rng_states`` for the global torch generator
and a user generator, ``gather_tensor_shape`` of a tensor one rank holds, and debug mode's ``DistributedOperationException`` from ``trainkit.utils.operations``.
Each rank writes ``report_rank<i>.json`` for tests/engine/test_accelerate_api_fixes.py to assert on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from trainkit import Accelerator, synchronize_rng_states
from trainkit.utils import reduce
from trainkit.utils.operations import DistributedOperationException, gather, gather_tensor_shape

OUT = Path(sys.argv[1])
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
report: dict = {"world": accelerator.num_processes}

values = torch.tensor([1.0 + rank, 5.0 - 3 * rank])  # rank 0: [1, 5], rank 1: [2, 2]
for reduction in ("sum", "mean", "max", "none"):
    report[f"accelerator_{reduction}"] = accelerator.reduce(values, reduction=reduction).tolist()
report["utils_default"] = reduce(values).tolist()
try:
    accelerator.reduce(values, reduction="min")
except ValueError as error:
    report["bad_reduction"] = str(error)

torch.manual_seed(100 + rank)  # every rank starts from a different global state...
generator = torch.Generator().manual_seed(200 + rank)  # ...and a different user generator
report["before"] = [torch.rand(1).item(), torch.rand(1, generator=generator).item()]
synchronize_rng_states(["torch", "generator"], generator=generator)
report["after"] = [torch.rand(1).item(), torch.rand(1, generator=generator).item()]

report["held_shape"] = gather_tensor_shape(torch.zeros(3, 2) if rank == 1 else None).tolist()

os.environ["ACCELERATE_DEBUG_MODE"] = "1"
report["debug"] = accelerator.state.debug
try:
    gather(torch.zeros(1 + rank))
    report["mismatch"] = "no error"
except DistributedOperationException as error:
    report["mismatch"] = str(error)
del os.environ["ACCELERATE_DEBUG_MODE"]
(OUT / f"report_rank{rank}.json").write_text(json.dumps(report))
