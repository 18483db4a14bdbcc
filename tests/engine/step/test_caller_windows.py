"""Accumulation where the caller opens every window (the Trainer): one number, the engine's (CPU, no processes)."""

from __future__ import annotations

import torch

from trainkit.engine import Accelerator, caller_opens_accumulation_windows
from trainkit.engine.step.accumulation import GradientState


def test_outside_a_window_each_micro_batch_is_its_own_window_and_the_number_stays() -> None:
    state = GradientState(4, caller_opens_windows=True)
    loss = torch.tensor(2.0)
    for _ in range(3):
        state.advance()
        assert state.sync_gradients and state.normalise_loss(loss, "mean", 1) is loss
    assert state.num_steps == 4
    state.open_window(4, 8)  # the caller's window: exactly its length
    syncs = []
    for _ in range(4):
        state.advance()
        syncs.append(state.sync_gradients)
    assert syncs == [False, False, False, True]


def test_without_the_caller_accumulate_opens_windows_of_the_number_and_divides_by_it() -> None:
    state = GradientState(4)
    syncs = []
    for _ in range(4):
        state.advance()
        syncs.append(state.sync_gradients)
    assert syncs == [False, False, False, True]
    assert state.normalise_loss(torch.tensor(2.0), "mean", 1).item() == 0.5


def test_the_accelerator_answers_the_runs_number_and_keeps_the_mode_through_free_memory() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    caller_opens_accumulation_windows(accelerator)
    assert accelerator.gradient_accumulation_steps == accelerator.config.gradient_accumulation_steps == 3
    accelerator.free_memory()
    assert accelerator.gradient_state.caller_opens_windows and accelerator.gradient_accumulation_steps == 3
