"""The strategy contract on CPU, one process: registry selection, capabilities, precision built by the
strategy, and the engine's one accumulation window (sync decisions and loss normalisation)."""

from __future__ import annotations

import pytest
import torch

from trainkit.engine.step.accumulation import GradientState
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
    from trainkit.config.parallelism import ParallelismConfig
    from trainkit.engine.parallel import ParallelDims

    assert [entry.name for entry in STRATEGIES] == ["nd", "fsdp", "ddp", "single"]
    assert strategy_entry(StrategyRequest(_state(1))).name == "single"
    assert strategy_entry(StrategyRequest(_state(2))).name == "ddp"
    assert strategy_entry(_fsdp_request()).name == "fsdp"
    dims = ParallelDims(ParallelismConfig(tp_size=2), 2, "cpu")  # the mesh is built only when asked for
    assert strategy_entry(StrategyRequest(_state(2), parallel_dims=dims)).name == "nd"


def test_data_parallel_size_and_rank_follow_the_tensor_parallel_groups() -> None:
    """CPU, no process group: with TP=2 on 4 processes, ranks (0,1) read share 0 and (2,3) share 1."""
    from trainkit.config.parallelism import ParallelismConfig
    from trainkit.engine.parallel import ParallelDims

    dims = ParallelDims(ParallelismConfig(dp_shard_size=-1, tp_size=2), 4, "cpu")
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.dp_size) == (1, 2, 2, 2)
    assert [dims.dp_rank(rank) for rank in range(4)] == [0, 0, 1, 1]
    assert [dims.tp_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    assert select_strategy(StrategyRequest(_state(4))).data_parallel_size == 4  # DDP: every process


@pytest.mark.parametrize(("sharding_strategy", "local", "degrees", "two_d"), [
    ("FULL_SHARD", 4, (1, 4), False), ("SHARD_GRAD_OP", 4, (1, 4), False), ("NO_SHARD", 4, (4, 1), True),
    ("HYBRID_SHARD", 2, (2, 2), True), ("HYBRID_SHARD_ZERO2", 4, (1, 4), True)])
def test_ddp_and_fsdp_strategies_are_layouts_of_one_parallel_dims(sharding_strategy: str, local: int,
                                                                  degrees: tuple[int, int], two_d: bool) -> None:
    """CPU, no process group (no mesh is built): DDP holds dp_replicate = world; each FSDP sharding strategy
    holds its (dp_replicate, dp_shard) degrees, and whether fully_shard gets the 2-D (replicate, shard) mesh."""
    from trainkit.config.fsdp import FSDPOptions
    from trainkit.engine.strategies.fsdp.strategy import FSDPStrategy

    ddp = select_strategy(StrategyRequest(_state(4)))
    assert ddp.dims is not None and (ddp.dims.dp_replicate, ddp.dims.dp_shard, ddp.dims.tp) == (4, 1, 1)
    state = _state(4)
    state.local_world_size = local
    fsdp = FSDPStrategy(state, None, options=FSDPOptions(sharding_strategy=sharding_strategy))
    assert (fsdp.dims.dp_replicate, fsdp.dims.dp_shard, fsdp.dims.tp) == (*degrees, 1)
    assert fsdp.dims.replicate_dimension is two_d
    assert fsdp.data_parallel_size == 4 and fsdp.data_group is None


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
