"""The parallel degrees of a run, as plain data: :class:`ParallelismConfig`, with Accelerate 1.15's field names.

A run's processes form a grid ``dp_replicate x dp_shard x tp`` (torchtitan's ``ParallelDims``, Accelerate's
``ParallelismConfig``): parameters are replicated across ``dp_replicate``, sharded FSDP-style across
``dp_shard``, and split tensor-parallel across ``tp``. The data dimensions (``dp_replicate``, ``dp_shard``)
read different batches; the ``tp`` ranks of one group read the same batch. DDP is ``dp_replicate = world``,
FSDP is ``dp_shard = world``, HSDP is both above 1.

This module owns the degrees and their validation (the product equals the world size; ``-1`` stands for
"the rest", as in torchtitan); the engine (``trainkit.engine.parallel``) builds the device mesh from the
resolved degrees. No torch here.

Where trainkit differs from Accelerate (each by design, and documented in docs/parallelism.md):

* ``-1`` is accepted for one degree ("whatever the world size leaves"); Accelerate requires sizes >= 1.
* ``tp_size > 1`` with pure replication (``dp_replicate_size > 1``, ``dp_shard_size == 1``) is accepted:
  trainkit runs it as TP x DDP (gradients all-reduced over the replicas). Accelerate refuses it.
* ``cp_size > 1`` and ``sp_size > 1`` are refused: PyTorch's context parallelism rewrites
  ``scaled_dot_product_attention`` for CUDA attention kernels only, and Accelerate's sequence parallelism
  is DeepSpeed's Ulysses, which trainkit does not run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

DEGREE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
"""The size fields, in Accelerate's order."""
MESH_ORDER = ("dp_replicate", "dp_shard", "tp")
"""Mesh dimensions outermost first: tensor-parallel ranks are neighbours (the fastest links)."""
LAUNCH_PREFIX = "parallelism_config_"
LAUNCH_KEYS = (*DEGREE_FIELDS, "cp_backend", "sp_backend", "cp_comm_strategy", "sp_seq_length",
               "sp_seq_length_is_variable", "sp_attn_implementation")
"""The keys of the launch YAML's ``parallelism_config:`` block and of the ``--parallelism_config_*`` flags,
after the prefix (Accelerate 1.15's launcher); the last four configure context/sequence parallelism, which
trainkit refuses, and are accepted only to be ignored while those sizes are 1."""
REST = -1
"""A degree of -1: whatever the world size leaves once the other degrees are applied."""

_CP_REASON = ("context parallelism (cp_size > 1) is not available in trainkit: PyTorch implements it by "
              "rewriting scaled_dot_product_attention for its CUDA attention kernels (flash / memory-efficient "
              "/ cuDNN), so it cannot run on CPU or be tested on trainkit's CI")
_SP_REASON = ("sequence parallelism (sp_size > 1) is Accelerate's DeepSpeed Ulysses backend, which trainkit does "
              "not run (trainkit translates DeepSpeed configs onto DDP/FSDP2)")


@dataclasses.dataclass
class ParallelismConfig:
    """How the processes are split between data, sharding and tensor parallelism (Accelerate's names).

    Pass it as ``Accelerator(parallelism_config=...)``, ``TrainingArguments(parallelism_config=...)``, or
    write a ``parallelism_config:`` block in the launch YAML (``parallelism_config_tp_size: 2``...).

    Args:
        dp_replicate_size: full copies of the (data-)sharded model; gradients are all-reduced across them.
        dp_shard_size: processes each model copy is sharded across (FSDP2); with ``dp_replicate_size > 1``: HSDP.
        tp_size: processes each layer is split across (tensor parallelism, by the model's TP plan).
        cp_size: reserved; a value above 1 is refused (context parallelism needs CUDA attention kernels).
        cp_backend: ``"torch"``, the only value Accelerate knows.
        sp_size: reserved; a value above 1 is refused (DeepSpeed's Ulysses).
        sp_backend: ``"deepspeed"``, the only value Accelerate knows.
        tp_handler: a TP handler object (Accelerate's ``TorchTensorParallelConfig``); trainkit reads a
            ``tp_plan`` attribute from it when present (a ``{module pattern: style}`` dict), else none.
        cp_handler, sp_handler: accepted only while their sizes are 1 (then they have no effect).

    A size left at None means 1. One degree may be ``-1``: the world size divided by the others.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None

    device_mesh = None  # type: Any  # not a dataclass field (as in Accelerate): set once the mesh exists
    """The device mesh built for this config by the Accelerator (class attribute until then, as in Accelerate)."""

    def __post_init__(self) -> None:
        for name in DEGREE_FIELDS:
            value = getattr(self, name)
            setattr(self, name, 1 if value is None else _degree(name, value))
        self.cp_backend = self.cp_backend or "torch"
        self.sp_backend = self.sp_backend or "deepspeed"
        if self.cp_backend != "torch":
            raise ConfigError(f"ParallelismConfig(cp_backend={self.cp_backend!r}): valid: ['torch'].")
        if self.sp_backend != "deepspeed":
            raise ConfigError(f"ParallelismConfig(sp_backend={self.sp_backend!r}): valid: ['deepspeed'].")
        if self.cp_size != 1:
            raise ConfigError(f"ParallelismConfig(cp_size={self.cp_size}): {_CP_REASON}. Use cp_size=1.")
        if self.sp_size != 1:
            raise ConfigError(f"ParallelismConfig(sp_size={self.sp_size}): {_SP_REASON}. Use sp_size=1.")
        rests = [name for name in DEGREE_FIELDS if getattr(self, name) == REST]
        if len(rests) > 1:
            raise ConfigError(f"ParallelismConfig: only one degree may be -1 (\"the rest\"); got -1 for {rests}.")

    # -- Accelerate's read-only views ---------------------------------------------------------------
    @property
    def dp_replicate_enabled(self) -> bool:
        """True when parameters are replicated across more than one data-parallel group."""
        return self._size("dp_replicate_size") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """True when parameters are sharded (FSDP) across more than one process."""
        return self._size("dp_shard_size") > 1

    @property
    def tp_enabled(self) -> bool:
        """True when layers are split tensor-parallel."""
        return self._size("tp_size") > 1

    @property
    def cp_enabled(self) -> bool:
        """Always False in trainkit (context parallelism is refused)."""
        return False

    @property
    def sp_enabled(self) -> bool:
        """Always False in trainkit (sequence parallelism is refused)."""
        return False

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions that read different data."""
        return [name for name, on in (("dp_replicate", self.dp_replicate_enabled), ("dp_shard", self.dp_shard_enabled))
                if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks read the same data."""
        return ["tp"] if self.tp_enabled else []

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the model is sharded across by FSDP (cp is never enabled here)."""
        return ["dp_shard"] if self.dp_shard_enabled else []

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged across."""
        return self.dp_dim_names

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The dimensions FSDP is applied across (replication first), as Accelerate names them."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Names of every enabled mesh dimension."""
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def total_size(self) -> int:
        """The product of the degrees (a -1 counts as 1 until resolved against a world size)."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Processes reading different data: ``dp_replicate_size * dp_shard_size``."""
        return self._size("dp_replicate_size") * self._size("dp_shard_size")

    @property
    def non_data_parallel_size(self) -> int:
        """Processes sharing one batch: ``tp_size`` (``cp_size`` and ``sp_size`` are 1)."""
        return self._size("tp_size")

    def _size(self, name: str) -> int:
        value = getattr(self, name)
        return 1 if value == REST else int(value)

    def resolved(self, world_size: int) -> ParallelismConfig:
        """A copy whose degrees multiply to ``world_size``: a -1 is filled in; all degrees 1 on more than one
        process means pure data parallelism (``dp_replicate_size = world``), as in Accelerate."""
        sizes = {name: getattr(self, name) for name in ("dp_replicate_size", "dp_shard_size", "tp_size")}
        known = 1
        for value in sizes.values():
            known *= 1 if value == REST else value
        rest = next((name for name, value in sizes.items() if value == REST), None)
        if rest is not None:
            if world_size % known:
                raise ConfigError(f"ParallelismConfig: {rest}=-1 needs the world size ({world_size}) to be divisible "
                                  f"by the other degrees' product ({known}).")
            sizes[rest] = world_size // known
        elif known == 1 and world_size > 1:
            sizes["dp_replicate_size"] = world_size
        product = sizes["dp_replicate_size"] * sizes["dp_shard_size"] * sizes["tp_size"]
        if product != world_size:
            shown = " x ".join(f"{name}={value}" for name, value in sizes.items())
            raise ConfigError(f"ParallelismConfig: {shown} = {product} processes, but the run has {world_size}. "
                              "Adjust the degrees (or set one to -1 for the rest).")
        return dataclasses.replace(self, **sizes)

    def degrees(self) -> dict[str, int]:
        """``{"dp_replicate": ..., "dp_shard": ..., "tp": ...}`` in mesh order (call on a resolved config)."""
        return {name: self._size(f"{name}_size") for name in MESH_ORDER}

    def to_dict(self) -> dict[str, Any]:
        """The degrees and backends (handlers are objects and are left out), for the launch YAML."""
        return {name: getattr(self, name) for name in (*DEGREE_FIELDS, "cp_backend", "sp_backend")}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> ParallelismConfig:
        """Build from a launch YAML block or flags: keys ``parallelism_config_<field>`` (as Accelerate writes
        them) or the bare field names; an unknown key is an error naming the valid ones."""
        chosen: dict[str, Any] = {}
        for key, value in values.items():
            name = key[len(LAUNCH_PREFIX):] if key.startswith(LAUNCH_PREFIX) else key
            if name not in LAUNCH_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}; valid: {[LAUNCH_PREFIX + k for k in LAUNCH_KEYS]}.")
            if name in DEGREE_FIELDS and value is not None:
                value = _degree(f"parallelism_config_{name}", value, where)
            chosen[name] = value
        # Settings of the refused dimensions mean nothing while those dimensions are off (size 1).
        for extra in LAUNCH_KEYS[len(DEGREE_FIELDS) + 2:]:
            chosen.pop(extra, None)
        return cls(**chosen)

    def to_launch_dict(self) -> dict[str, Any]:
        """The ``parallelism_config:`` block as Accelerate writes it (``parallelism_config_<field>`` keys)."""
        return {LAUNCH_PREFIX + name: value for name, value in self.to_dict().items()}


def _degree(name: str, value: Any, where: str = "ParallelismConfig") -> int:
    """A degree: an integer >= 1, or -1 for "the rest"."""
    try:
        number = int(value)
        if isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name}={value!r} is not an integer (>= 1, or -1 for the rest).") from None
    if number < 1 and number != REST:
        raise ConfigError(f"{where}: {name}={value!r}: a degree is at least 1 (or -1 for the rest).")
    return number
