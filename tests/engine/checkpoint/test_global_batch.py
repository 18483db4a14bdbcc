"""Keeping the global batch on another world size: the one decision (``engine/checkpoint/global_batch.py``) and what
a checkpoint records for it. CPU, in this process; the processes that shrink and grow are in
``tests/cli/test_elastic_launch.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator
from trainkit.engine.checkpoint.global_batch import BatchShape, GlobalBatchError, keep_global_batch


def test_the_same_world_size_changes_nothing():
    assert keep_global_batch(BatchShape(2, 8, 1), BatchShape(2, 8, 1), "ckpt") is None
    assert keep_global_batch(BatchShape(2, 8, 1), BatchShape(1, None, 1), "ckpt") is None  # unbatched: unknown


@pytest.mark.parametrize("saved, current, accumulation", [
    (BatchShape(2, 8, 1), BatchShape(1, 4, 1), 2),   # a machine left: twice the micro-batches
    (BatchShape(1, 4, 2), BatchShape(2, 8, 1), 1),   # it came back
    (BatchShape(4, 8, 3), BatchShape(2, 4, 1), 6),   # 24 samples per step on a world reading 4 per micro-step
    (BatchShape(2, 8, 1), BatchShape(1, 8, 1), 1),   # the script doubled its per-process batch instead
])
def test_accumulation_makes_up_for_lost_or_added_ranks(saved, current, accumulation):
    rescale = keep_global_batch(saved, current, "ckpt")
    assert rescale is not None and rescale.accumulation == accumulation
    assert rescale.accumulation * current.loader_global_batch == saved.samples_per_step
    line = rescale.describe(current.accumulation, current.world_size)
    assert f"World size {saved.world_size} -> {current.world_size}" in line
    assert f"gradient_accumulation_steps {saved.accumulation} -> {accumulation}" in line


def test_a_global_batch_that_does_not_divide_is_refused_with_the_numbers():
    with pytest.raises(GlobalBatchError) as caught:
        keep_global_batch(BatchShape(3, 6, 1), BatchShape(2, 4, 1), "out/checkpoint_4")
    message = str(caught.value)
    for part in ("out/checkpoint_4", "on 2 processes", "6 samples per optimizer step", "over 3 processes",
                 "not a multiple", "4 samples per micro-batch"):
        assert part in message


def test_a_checkpoint_records_world_size_accumulation_and_the_loaders_global_batch(tmp_path):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    folder = accelerator.save_state(tmp_path / "ckpt")
    assert accelerator.checkpointer.saved_batch_shape(folder) == BatchShape(world_size=1, loader_global_batch=4, accumulation=3)
    assert accelerator.checkpointer.saved_batch_shape(folder, accumulation=5).accumulation == 5  # the Trainer's own record wins
    assert accelerator.checkpointer.saved_batch_shape(str(tmp_path)) is None  # no engine state there
    accelerator.load_state(folder)  # same world size: the configured accumulation stays
    assert accelerator.gradient_accumulation_steps == 3
    assert accelerator.config.source_of("gradient_accumulation_steps") == "Accelerator(gradient_accumulation_steps=)"
