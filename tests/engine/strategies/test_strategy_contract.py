"""The strategy contract on CPU, one process: registry selection, capabilities, precision built by the
strategy, and the engine's one accumulation window (sync decisions and loss normalisation)."""

from __future__ import annotations

import pytest
import torch

from trainkit.engine.step.accumulation import GradientState, accumulation_windows
from trainkit.engine.process.state import ProcessState
from trainkit.engine.strategies import STRATEGIES, StrategyRequest, select_strategy
from trainkit.engine.strategies.registry import strategy_entry


def _state(world_size: int = 1) -> ProcessState:
    state = ProcessState.__new__(ProcessState)  # no process group: selection and precision need none
    state.device, state.rank, state.world_size, state.local_world_size = torch.device("cpu"), 0, world_size, world_size
    return state


def _fsdp_request() -> StrategyRequest:
    from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    return StrategyRequest(_state(1), fsdp_plugin=plugin, fsdp_options=plugin.options)


def test_registry_picks_the_first_strategy_that_applies() -> None:
    assert [entry.name for entry in STRATEGIES] == ["fsdp", "ddp", "single"]
    assert strategy_entry(StrategyRequest(_state(1))).name == "single"
    assert strategy_entry(StrategyRequest(_state(2))).name == "ddp"
    assert strategy_entry(_fsdp_request()).name == "fsdp"


def test_capabilities_are_stated_per_strategy() -> None:
    from trainkit.engine.strategies.fsdp.strategy import FSDPStrategy

    single = select_strategy(StrategyRequest(_state(1)))
    assert not single.capabilities.shards_parameters and single.capabilities.gradient_reduction == "mean"
    ddp = strategy_entry(StrategyRequest(_state(2))).load()
    assert ddp.capabilities.supports_no_sync and not ddp.capabilities.shards_parameters
    fsdp = FSDPStrategy.capabilities
    assert fsdp.shards_parameters and fsdp.needs_sharded_grad_scaler and fsdp.replaces_parameters
    assert isinstance(select_strategy(_fsdp_request()), FSDPStrategy)


def test_fsdp_builds_a_sharded_grad_scaler_with_the_scripts_settings() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    fsdp = select_strategy(_fsdp_request())
    precision = fsdp.build_precision("fp16", {"init_scale": 1024.0, "growth_interval": 7})
    assert isinstance(precision.scaler, ShardedGradScaler) and fsdp.precision is precision
    assert precision.scaler.get_scale() == 1024.0 and precision.scaler.get_growth_interval() == 7
    single = select_strategy(StrategyRequest(_state(1)))
    plain = single.build_precision("fp16", {"init_scale": 1024.0})
    assert type(plain.scaler) is torch.amp.GradScaler and plain.scaler.get_scale() == 1024.0
    assert single.build_precision("bf16").scaler is None


def test_implicit_windows_sync_every_num_steps_and_divide_the_loss() -> None:
    state = GradientState(3)
    syncs = []
    for _ in range(6):
        state.advance()
        syncs.append(state.sync_gradients)
    assert syncs == [False, False, True, False, False, True]
    loss = torch.tensor(6.0)
    assert torch.equal(state.normalise_loss(loss, "mean", 2), loss / 3)


def test_explicit_windows_sync_at_their_last_micro_batch_and_scale_for_mean_reduction() -> None:
    state = GradientState(4)
    state.open_window(2, global_items=10)  # a short last window of two micro-batches
    state.advance()
    assert not state.sync_gradients and state.window_items == 10
    loss = torch.tensor(0.3)
    assert torch.equal(state.normalise_loss(loss, "mean", 2), loss * 2)  # averaged over 2 ranks: undo it
    assert torch.equal(state.normalise_loss(loss, "sum", 2), loss)
    assert torch.equal(state.normalise_loss(loss, "mean", 1), loss)
    state.advance()
    assert state.sync_gradients
    state.advance()  # back to implicit windows of num_steps
    assert not state.sync_gradients and not state.loss_is_global_share
    with pytest.raises(ValueError, match="at least one micro-batch"):
        state.open_window(0)


def test_accumulation_windows_keep_the_short_last_window() -> None:
    assert list(accumulation_windows(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
