"""Accelerate API names fixed for issue 23, in real processes: 2 gloo ranks on CPU under torchrun.

``reduce`` with every reduction Accelerate accepts, ``synchronize_rng_states`` for the global torch generator
and a user generator, ``gather_tensor_shape`` of a tensor one rank holds, and debug mode's ``DistributedOperationException`` from ``trainkit.utils.operations``;
from Accelerate's test_distributed_data_loop.py: a ``BatchSampler`` given as ``sampler=`` (``batch_size=None``),
``save_state`` into a different folder on each rank (refused with a clear error), and ``gather_for_metrics`` on a
full last batch (nothing dropped, as Accelerate's remainder is 0).
Each rank writes ``report_rank<i>.json`` for tests/engine/test_accelerate_api_fixes.py to assert on.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from trainkit import Accelerator, synchronize_rng_states
from trainkit.engine.checkpoint.errors import CheckpointError
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

class Batched(torch.utils.data.Dataset):
    """Indexed with a whole list of indices at once (as ``datasets.Dataset`` is): returns the list's tensor."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        return torch.tensor(indices)


sampler = BatchSampler(RandomSampler(range(10)), batch_size=3, drop_last=False)
loader = accelerator.prepare(DataLoader(Batched(), sampler=sampler, batch_size=None, collate_fn=lambda batch: batch))
report["batched_sampler_batches"] = [batch.tolist() for batch in loader]
report["batched_sampler_all"] = sorted(accelerator.gather(torch.cat(
    [torch.tensor(b) for b in report["batched_sampler_batches"]])).tolist())

# gather_for_metrics at the last batch of a loader whose last global batch is full (6 samples, 1 per rank and
# batch) keeps every gathered row, also of a tensor that is not one row per sample (a loss repeated 4 times).
eval_loader = accelerator.prepare(DataLoader(torch.arange(6.0), batch_size=1))
for sample in eval_loader:
    kept = accelerator.gather_for_metrics(torch.full((4,), float(rank)))
    remainder_at_end = accelerator.gradient_state.remainder  # the last batch's value is what counts
report["full_last_batch_kept"] = [remainder_at_end, kept.tolist()]

with tempfile.TemporaryDirectory() as own_folder:  # a different path on each rank: each keeps its part there
    try:
        accelerator.save_state(own_folder)
        accelerator.load_state(own_folder)
        report["per_rank_folders"] = sorted(os.listdir(own_folder))
    except CheckpointError as error:
        report["per_rank_folders"] = str(error)
(OUT / f"report_rank{rank}.json").write_text(json.dumps(report))
