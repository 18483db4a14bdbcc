"""One object for a run's parallel degrees and the device mesh they form.

:class:`ParallelDims` takes a :class:`~trainkit.config.parallelism.ParallelismConfig` resolved against the
world size and builds one mesh ``dp_replicate x dp_shard x cp x sp x tp`` (Accelerate's order; every dimension
present, size-1 ones too, so each sub-mesh exists whatever the degrees). Every multi-process strategy holds one:
DDP is ``dp_replicate = world`` (:meth:`ParallelDims.data_parallel`; it needs no mesh), FSDP2 is
``dp_shard = world``, HSDP and FSDP's NO_SHARD are ``dp_replicate x dp_shard`` (:meth:`ParallelDims.of`), and a
ParallelismConfig may add ``tp`` and one sequence dimension (``cp`` or ``sp``). Its sub-meshes are what the rest
of the engine asks for:

* :attr:`tp_mesh`: the ranks that split one layer (and read the same batch);
* :attr:`sequence_mesh`: the ranks that split one sequence (``cp`` or ``sp``; they read the same batch);
* :attr:`fsdp_mesh`: what ``fully_shard`` shards/replicates across: ``dp_shard_cp`` (``dp_shard`` flattened with
  the sequence dimension, whose ranks hold the same model) alone, or ``(dp_replicate, dp_shard_cp)`` (HSDP);
* :attr:`dp_mesh` (the flattened data dimensions): data loading and evaluation gathers.

Ranks are laid out with ``tp`` innermost, then the sequence dimension, so
``rank = (dp_rank * cp * sp + sequence_rank) * tp + tp_rank``.
"""

from __future__ import annotations

from functools import cached_property

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainkit.config.parallelism import MESH_ORDER, ParallelismConfig


class ParallelDims:
    """The resolved degrees of a run and its named device mesh (built on first use, collectively)."""

    def __init__(self, config: ParallelismConfig, world_size: int, device_type: str, *,
                 replicate_dimension: bool = False) -> None:
        """``replicate_dimension``: give ``fully_shard`` the 2-D ``(dp_replicate, dp_shard_cp)`` mesh even when
        ``dp_replicate`` is 1 (FSDP's HYBRID strategies on one machine keep their 2-D layout)."""
        self.config = config.resolved(world_size)
        self.world_size = world_size
        self.device_type = device_type
        degrees = self.config.degrees()
        self.dp_replicate, self.dp_shard, self.tp = degrees["dp_replicate"], degrees["dp_shard"], degrees["tp"]
        self.cp, self.sp = degrees["cp"], degrees["sp"]
        self.replicate_dimension = replicate_dimension or self.dp_replicate > 1

    @classmethod
    def of(cls, world_size: int, device_type: str, *, dp_replicate: int = 1, dp_shard: int = 1, tp: int = 1,
           replicate_dimension: bool = False) -> ParallelDims:
        """The degrees given directly (checked against ``world_size`` as a ParallelismConfig's are)."""
        config = ParallelismConfig(dp_replicate_size=dp_replicate, dp_shard_size=dp_shard, tp_size=tp)
        return cls(config, world_size, device_type, replicate_dimension=replicate_dimension)

    @classmethod
    def data_parallel(cls, world_size: int, device_type: str) -> ParallelDims:
        """DDP's degrees: every process holds a whole replica and reads its own batch."""
        return cls.of(world_size, device_type, dp_replicate=world_size)

    @property
    def pure_replication(self) -> bool:
        """Nothing sharded or split: each process a whole replica (DDP's layout)."""
        return self.dp_shard == 1 and self.tp == 1 and self.sequence_size == 1

    @property
    def dp_size(self) -> int:
        """Processes reading different batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def sequence_size(self) -> int:
        """Processes one sequence is split across (``cp`` or ``sp``; 1 without either)."""
        return self.cp * self.sp

    @property
    def sequence_dimension(self) -> str | None:
        """``"cp"``, ``"sp"``, or None when sequences are not split."""
        return "cp" if self.cp > 1 else "sp" if self.sp > 1 else None

    def dp_rank(self, rank: int) -> int:
        """Which share of the data ``rank`` reads (the same for every rank of a TP or sequence group)."""
        return rank // (self.tp * self.sequence_size)

    def tp_rank(self, rank: int) -> int:
        """``rank``'s position inside its TP group."""
        return rank % self.tp

    def sequence_rank(self, rank: int) -> int:
        """``rank``'s position inside its sequence (cp or sp) group: which part of each sequence it holds."""
        return (rank // self.tp) % self.sequence_size

    @cached_property
    def mesh(self) -> DeviceMesh:
        """The whole mesh, dimensions named ``dp_replicate``, ``dp_shard``, ``cp``, ``sp``, ``tp`` (collective: every
        rank builds it), with the flattened ``dp`` (``dp_replicate x dp_shard``), ``dp_shard_cp`` (``dp_shard x cp
        x sp``: what FSDP shards across) and ``dp_cp`` (all of those: the ranks a loss is averaged across)."""
        shape = (self.dp_replicate, self.dp_shard, self.cp, self.sp, self.tp)
        mesh = init_device_mesh(self.device_type, shape, mesh_dim_names=MESH_ORDER)
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
        mesh["dp_shard", "cp", "sp"]._flatten("dp_shard_cp")
        mesh["dp_replicate", "dp_shard", "cp", "sp"]._flatten("dp_cp")
        return mesh

    @property
    def tp_mesh(self) -> DeviceMesh:
        """The ranks one layer is split across."""
        return self.mesh["tp"]

    @property
    def sequence_mesh(self) -> DeviceMesh:
        """The ranks one sequence is split across (``cp`` or ``sp``)."""
        return self.mesh[self.sequence_dimension or "sp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The data-parallel ranks of this rank's TP and sequence position (flattened ``dp_replicate x dp_shard``)."""
        return self.mesh["dp"]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """What ``fully_shard`` spans: 1-D ``dp_shard`` without replicas, else 2-D ``(dp_replicate, dp_shard)``
        (replicated across the first dimension, sharded across the second; DDP-like when it has size 1). With a
        sequence dimension, ``dp_shard_cp`` takes ``dp_shard``'s place: the sequence ranks hold the same model, and
        FSDP's reduction combines their gradients."""
        shard = "dp_shard_cp" if self.sequence_size > 1 else "dp_shard"  # the same ranks when sequences are whole
        if not self.replicate_dimension:
            return self.mesh[shard]
        return self.mesh["dp_replicate", shard]

    @property
    def dp_group(self) -> dist.ProcessGroup:
        """The process group of :attr:`dp_mesh` (gathers of evaluation results, item counts)."""
        return self.dp_mesh.get_group()

    def describe(self) -> str:
        """``dp_replicate=2 x dp_shard=1 x tp=2`` (``x sp=2`` / ``x cp=2`` when set) and the strategy that is."""
        data = ("HSDP" if self.dp_replicate > 1 and self.dp_shard > 1 else "FSDP" if self.dp_shard > 1 else
                "DDP" if self.dp_replicate > 1 else None)
        split = [name.upper() for name in ("tp", "cp", "sp") if getattr(self, name) > 1]
        kind = " x ".join(split + [data]) if data else " x ".join(split) or "one data replica"
        sequence = "".join(f" x {name}={getattr(self, name)}" for name in ("cp", "sp") if getattr(self, name) > 1)
        return f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard}{sequence} x tp={self.tp} ({kind})"
