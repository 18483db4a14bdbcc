"""CUDA, one process: a steady-state step waits on the host for nothing, in the engine and in the Trainer.

``torch.cuda.set_sync_debug_mode("error")`` raises on every operation that synchronises the host with
the GPU (``.item()``, a blocking copy, ``nonzero``...). Warm-up steps run outside it: the first steps
allocate, autotune and build the pinned-memory thread; logging steps read the loss on purpose.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.gpu


@contextlib.contextmanager
def syncs_are_errors():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _data(samples: int = 96) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, 32, generator=generator), torch.randint(0, 4, (samples,), generator=generator))


def test_engine_steady_state_step_has_no_host_sync():
    from trainkit import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(_data(), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for index, (x, y) in enumerate(loader):
        with syncs_are_errors() if index >= 3 else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    torch.cuda.synchronize()


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_trainer_steady_state_steps_have_no_host_sync(tmp_path):
    from trainkit import Trainer, TrainerCallback, TrainingArguments

    class StrictAfterWarmUp(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step >= 3:
                torch.cuda.set_sync_debug_mode("error")

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.set_sync_debug_mode("default")  # callbacks, logging and saving may read values

    samples = [{"x": x, "labels": y} for x, y in _data()]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, bf16=True, max_steps=10,
                             logging_steps=100, save_strategy="no", report_to="none", disable_tqdm=True)
    trainer = Trainer(model=_Classifier(), args=args, train_dataset=samples, callbacks=[StrictAfterWarmUp()])
    try:
        trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.state.global_step == 10
