"""How prepare reads a model that transformers sharded while loading it, across transformers versions (CPU, one
process, no process group). The stand-in models carry exactly the attributes each version sets (read from
transformers' DistributedMixin.maybe_distribute_model: 5.24 flags the model and keeps its ``(pp, fsdp, tp)`` mesh
view; 5.17 sets ``_device_mesh``, ``_tp_size`` and ``config.distributed_config`` only, and applies TP alone when
both tp_size and fsdp_size are above 1). The real loads run in test_nd_parallel_pretrained.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from trainkit.config.errors import ConfigError
from trainkit.config.parallelism import ParallelismConfig
from trainkit.engine.parallel.pretrained import check_run_matches, sharded_by_transformers, transformers_layout


class Mesh:
    """The part of a DeviceMesh the layout reads: names, sizes, sub-meshes by name."""

    def __init__(self, sizes: dict[str, int] | int) -> None:
        self.sizes = sizes

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        return tuple(self.sizes) if isinstance(self.sizes, dict) else None

    def size(self) -> int:
        if isinstance(self.sizes, int):
            return self.sizes
        total = 1
        for value in self.sizes.values():
            total *= value
        return total

    def __getitem__(self, name: str) -> Mesh:
        assert isinstance(self.sizes, dict)
        return Mesh({name: self.sizes[name]})


def _model(mesh: Mesh | None, flag: bool | None, tp_size: int, **config: int) -> nn.Module:
    model = nn.Linear(2, 2)
    distributed = SimpleNamespace(tp_size=tp_size, **config)
    model.config = SimpleNamespace(distributed_config=distributed)  # type: ignore[assignment]
    model._device_mesh = mesh  # type: ignore[assignment]
    model._tp_size = tp_size  # type: ignore[assignment]
    if flag is not None:
        model.is_distributed_loading_by_transformers = flag  # type: ignore[assignment]
    return model


def test_transformers_5_24_tp_fsdp_model_is_read_from_its_mesh() -> None:
    model = _model(Mesh({"pp": 1, "fsdp": 2, "tp": 2}), True, 2, fsdp_size=2, dp_replicate_size=1)
    assert sharded_by_transformers(model)
    assert transformers_layout(model).degrees() == {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "sp": 1, "tp": 2}
    check_run_matches(model, ParallelismConfig(dp_shard_size=2, tp_size=2), 4)


def test_transformers_5_17_models_have_no_flag_but_are_recognised() -> None:
    fsdp = _model(Mesh({"fsdp": 4}), None, 1, fsdp_size=4)
    tp = _model(Mesh(4), None, 4, fsdp_size=1)  # 5.17's TP mesh: one unnamed dimension
    assert sharded_by_transformers(fsdp) and sharded_by_transformers(tp)
    assert transformers_layout(fsdp).degrees() == {"dp_replicate": 1, "dp_shard": 4, "cp": 1, "sp": 1, "tp": 1}
    assert transformers_layout(tp).degrees() == {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "sp": 1, "tp": 4}
    assert not sharded_by_transformers(_model(None, None, 1, fsdp_size=1))  # a config, nothing applied


def test_a_layout_transformers_applied_only_in_part_is_refused_naming_why() -> None:
    """5.17 with DistributedConfig(tp_size=2, fsdp_size=2) on 4 processes: TP on 2 processes, no FSDP."""
    model = _model(Mesh(2), None, 2, fsdp_size=2)
    with pytest.raises(ConfigError, match=r"over 2 of the 4 processes.*applies tp_size or fsdp_size, not both"):
        check_run_matches(model, ParallelismConfig(dp_shard_size=2, tp_size=2), 4)


@pytest.mark.parametrize("run", [None, ParallelismConfig(dp_replicate_size=4)])
def test_a_run_laid_out_otherwise_is_refused_with_the_config_that_fits(run: ParallelismConfig | None) -> None:
    """Plain DDP over 4 processes (no config, or replication only) reads 4 batches like FSDP4, but the strategy
    would not be the model's: the error gives the ParallelismConfig to pass."""
    model = _model(Mesh({"fsdp": 4}), None, 1, fsdp_size=4)
    with pytest.raises(ConfigError, match=r"ParallelismConfig\(dp_replicate_size=1, dp_shard_size=4, tp_size=1\)"):
        check_run_matches(model, run, 4)
