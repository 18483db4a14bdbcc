"""The parallel degrees of a run, as plain data: :class:`ParallelismConfig`, with Accelerate 1.15's field names,
and the settings of its context- and sequence-parallel dimensions (:class:`TorchContextParallelConfig`,
:class:`DeepSpeedSequenceParallelConfig`, Accelerate's classes and fields).

A run's processes form a grid ``dp_replicate x dp_shard x cp x sp x tp`` (torchtitan's ``ParallelDims``,
Accelerate's ``ParallelismConfig`` and mesh order): parameters are replicated across ``dp_replicate``, sharded
FSDP-style across ``dp_shard`` (and across ``cp`` / ``sp``, whose ranks hold the same model), and split
tensor-parallel across ``tp``. The data dimensions (``dp_replicate``, ``dp_shard``) read different batches;
the ranks of one ``cp``, ``sp`` or ``tp`` group read the same batch (``cp`` and ``sp`` then split its sequence).
DDP is ``dp_replicate = world``, FSDP is ``dp_shard = world``, HSDP is both above 1.

This module owns the degrees and their validation (the product equals the world size; ``-1`` stands for
"the rest", as in torchtitan); the engine (``trainkit.engine.parallel``) builds the device mesh from the
resolved degrees. No torch here.

Where trainkit differs from Accelerate (each by design, and documented in docs/parallelism.md):

* ``-1`` is accepted for one degree ("whatever the world size leaves"); Accelerate requires sizes >= 1.
* ``tp_size`` or ``cp_size`` above 1 with pure replication (``dp_replicate_size > 1``, ``dp_shard_size == 1``)
  is accepted: trainkit runs it over the replicas (TP x DDP; CP/SP shard across their own ranks). Accelerate
  refuses it.
* ``sp_size > 1`` (``sp_backend="deepspeed"``, the Ulysses algorithm of DeepSpeed's ALST) runs on torch's
  collectives: no DeepSpeed package or config; its ranks are a mesh dimension that FSDP shards across, as ``cp``.
* Handler settings given for a dimension of size 1 are dropped with a warning (Accelerate warns too).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .options import Option

DEGREE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
"""The size fields, in Accelerate's order."""
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
"""Mesh dimensions outermost first (Accelerate's order): tensor-parallel ranks are neighbours (the fastest
links), then the ranks that split one sequence."""
CP_SETTINGS = ("cp_comm_strategy",)
"""The fields of :class:`TorchContextParallelConfig` (``cp_handler``)."""
SP_SETTINGS = ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")
"""The fields of :class:`DeepSpeedSequenceParallelConfig` (``sp_handler``)."""
LAUNCH_PREFIX = "parallelism_config_"
ENV_PREFIX = "PARALLELISM_CONFIG_"
"""Fields left at None are read from ``PARALLELISM_CONFIG_<FIELD>`` (what ``accelerate launch`` exports), as in
Accelerate; a field given in code wins."""
REST = -1
"""A degree of -1: whatever the world size leaves once the other degrees are applied."""
CP_COMM_STRATEGIES = ("allgather", "alltoall")
"""How torch's ring attention moves key/value shards between the ranks of a context-parallel group."""
SP_ATTENTION_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "flash_attention_3")
"""Attention implementations Ulysses can run inside (besides hub-hosted flash kernels), as Accelerate lists them."""


def _degree_option(text: str) -> Option:
    return Option(help=text, parse=lambda value, key, where: None if value is None else _degree(key, value, where))


PARALLELISM_OPTIONS: dict[str, Option] = {
    "dp_replicate_size": _degree_option("Full model copies; gradients all-reduced across them (-1: the rest of the "
                                        "processes)."),
    "dp_shard_size": _degree_option("Processes each copy is sharded across with FSDP2 (-1: the rest)."),
    "tp_size": _degree_option("Processes each layer is split across (tensor parallel, by the model's TP plan)."),
    "cp_size": _degree_option("Processes each sequence is split across, attention by torch's ring attention "
                              "(CUDA only)."),
    "sp_size": _degree_option("Processes each sequence is split across, attention by Ulysses all-to-all over the "
                              "heads."),
    "cp_backend": Option(help="torch (the only value).", choices=("torch",)),
    "sp_backend": Option(help="deepspeed (the only value: the Ulysses algorithm, run on torch's collectives).",
                         choices=("deepspeed",)),
    "cp_comm_strategy": Option(help="allgather (default) or alltoall: how the ring passes key/value shards "
                               "(cp_size > 1).", choices=CP_COMM_STRATEGIES),
    "sp_seq_length": Option(help="The length every batch has, checked when "
                            "--parallelism_config_sp_seq_length_is_variable false."),
    "sp_seq_length_is_variable": Option(help="true (default): any batch length, padded to a multiple of sp_size; "
                                        "false: fixed."),
    "sp_attn_implementation": Option(help="Attention run on the gathered sequence: sdpa (default), "
                                     "flash_attention_2/3."),
}
"""The keys of the launch YAML's ``parallelism_config:`` block and of the ``--parallelism_config_*`` flags, after
the prefix (Accelerate 1.15's launcher), declared once with their help; the degrees are parsed here, the backends
and the cp/sp settings by :class:`ParallelismConfig` and the handler classes they build."""
LAUNCH_KEYS = tuple(PARALLELISM_OPTIONS)


@dataclasses.dataclass
class TorchContextParallelConfig:
    """Settings of context parallelism (``ParallelismConfig(cp_size=..., cp_handler=...)``), Accelerate's class.

    Args:
        cp_comm_strategy: how torch's ring attention exchanges key/value shards: ``"allgather"`` (default: all
            shards gathered once) or ``"alltoall"`` (passed around the ring, one neighbour at a time).
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get(f"{ENV_PREFIX}CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ConfigError(f"TorchContextParallelConfig: Invalid cp_comm_strategy: {self.cp_comm_strategy} "
                              f"(valid: {list(CP_COMM_STRATEGIES)}).")


@dataclasses.dataclass
class DeepSpeedSequenceParallelConfig:
    """Settings of sequence parallelism (``ParallelismConfig(sp_size=..., sp_handler=...)``), Accelerate's class.

    trainkit runs the Ulysses algorithm on torch's collectives (no DeepSpeed package): these fields keep
    Accelerate's names and meanings.

    Args:
        sp_seq_length: the sequence length of every batch, checked when ``sp_seq_length_is_variable`` is False.
        sp_seq_length_is_variable: True (default): batches may have any length (each is padded at its end to a
            multiple of ``sp_size``, which changes no loss); False: every batch must be ``sp_seq_length`` long.
        sp_attn_implementation: the attention that runs on the gathered sequence (``"sdpa"`` by default,
            ``"flash_attention_2"``/``"_3"`` on GPUs, or a hub flash kernel); ``eager`` and ``flex_attention``
            are refused, as in Accelerate.
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = True
        self.sp_seq_length_is_variable = _flag("sp_seq_length_is_variable", self.sp_seq_length_is_variable)
        if self.sp_seq_length is not None:
            self.sp_seq_length = _degree("sp_seq_length", self.sp_seq_length, "DeepSpeedSequenceParallelConfig")
            if self.sp_seq_length == REST:
                raise ConfigError("DeepSpeedSequenceParallelConfig: sp_seq_length=-1 is not a length.")
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raise ConfigError("DeepSpeedSequenceParallelConfig: sp_seq_length_is_variable=False needs sp_seq_length "
                              "(the length every batch has).")
        name = self.sp_attn_implementation
        if name is not None and name not in SP_ATTENTION_IMPLEMENTATIONS and not ("/" in name and "flash-attn" in name):
            raise ConfigError(f"DeepSpeedSequenceParallelConfig(sp_attn_implementation={name!r}): valid: "
                              f"{list(SP_ATTENTION_IMPLEMENTATIONS)} or a hub flash kernel "
                              "('kernels-community/flash-attn2'); eager and flex_attention cannot run the gathered "
                              "sequence.")


@dataclasses.dataclass
class ParallelismConfig:
    """How the processes are split between data, sharding, sequence and tensor parallelism (Accelerate's names).

    Pass it as ``Accelerator(parallelism_config=...)``, ``TrainingArguments(parallelism_config=...)``, or
    write a ``parallelism_config:`` block in the launch YAML (``parallelism_config_tp_size: 2``...).

    Args:
        dp_replicate_size: full copies of the (data-)sharded model; gradients are all-reduced across them.
        dp_shard_size: processes each model copy is sharded across (FSDP2); with ``dp_replicate_size > 1``: HSDP.
        tp_size: processes each layer is split across (tensor parallelism, by the model's TP plan).
        cp_size: processes each sequence is split across, attention running as torch's ring attention
            (context parallelism; CUDA attention kernels).
        cp_backend: ``"torch"``, the only value Accelerate knows.
        sp_size: processes each sequence is split across, attention running on all of it for a share of the
            heads (sequence parallelism, Ulysses style, on torch's all-to-all). Exclusive with ``cp_size``.
        sp_backend: ``"deepspeed"``, the only value Accelerate knows (the Ulysses algorithm of DeepSpeed's ALST;
            trainkit runs it on torch's collectives).
        tp_handler: a TP handler object (Accelerate's ``TorchTensorParallelConfig``); trainkit reads a
            ``tp_plan`` attribute from it when present (a ``{module pattern: style}`` dict), else none.
        cp_handler: a :class:`TorchContextParallelConfig` (or Accelerate's); default one when ``cp_size > 1``.
        sp_handler: a :class:`DeepSpeedSequenceParallelConfig` (or Accelerate's); default one when ``sp_size > 1``.

    A field left at None is read from ``PARALLELISM_CONFIG_<FIELD>`` when set (as Accelerate does), else a size
    is 1. One degree may be ``-1``: the world size divided by the others.
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
            value = _from_environment(name, getattr(self, name))
            setattr(self, name, 1 if value is None else _degree(name, value))
        self.cp_backend = _from_environment("cp_backend", self.cp_backend) or "torch"
        self.sp_backend = _from_environment("sp_backend", self.sp_backend) or "deepspeed"
        if self.cp_backend != "torch":
            raise ConfigError(f"ParallelismConfig(cp_backend={self.cp_backend!r}): valid: ['torch'].")
        if self.sp_backend != "deepspeed":
            raise ConfigError(f"ParallelismConfig(sp_backend={self.sp_backend!r}): valid: ['deepspeed'] (the Ulysses "
                              "algorithm; trainkit runs it on torch's collectives).")
        rests = [name for name in DEGREE_FIELDS if getattr(self, name) == REST]
        if len(rests) > 1:
            raise ConfigError(f"ParallelismConfig: only one degree may be -1 (\"the rest\"); got -1 for {rests}.")
        if self.cp_size != 1 and self.sp_size != 1:
            raise ConfigError(f"ParallelismConfig(cp_size={self.cp_size}, sp_size={self.sp_size}): context and "
                              "sequence parallelism both split the sequence; set one of them to 1.")
        # A handler belongs to a dimension that is on: above 1, or -1 (the rest, known once resolved).
        self.cp_handler = _handler(self.cp_handler, TorchContextParallelConfig, CP_SETTINGS, self.cp_size != 1, "cp")
        self.sp_handler = _handler(self.sp_handler, DeepSpeedSequenceParallelConfig, SP_SETTINGS, self.sp_size != 1, "sp")

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
        """True when sequences are split for torch's ring attention (``cp_size > 1``)."""
        return self._size("cp_size") > 1

    @property
    def sp_enabled(self) -> bool:
        """True when sequences are split for Ulysses attention (``sp_size > 1``)."""
        return self._size("sp_size") > 1

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions that read different data."""
        return [name for name, on in (("dp_replicate", self.dp_replicate_enabled), ("dp_shard", self.dp_shard_enabled))
                if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks read the same data (Accelerate's order: tp, cp, sp)."""
        return [name for name, on in (("tp", self.tp_enabled), ("cp", self.cp_enabled), ("sp", self.sp_enabled)) if on]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions FSDP shards the model across: ``dp_shard`` and the sequence dimension (``cp``;
        in trainkit ``sp`` too, whose ranks also hold one model)."""
        return [name for name, on in (("dp_shard", self.dp_shard_enabled), ("cp", self.cp_enabled),
                                      ("sp", self.sp_enabled)) if on]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged across (the data dimensions and the sequence dimension)."""
        return self.dp_dim_names + [name for name in ("cp", "sp") if getattr(self, f"{name}_enabled")]

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
        """Processes sharing one batch: ``tp_size * cp_size * sp_size``."""
        return self._size("tp_size") * self._size("cp_size") * self._size("sp_size")

    def _size(self, name: str) -> int:
        value = getattr(self, name)
        return 1 if value == REST else int(value)

    def _get_mesh(self) -> tuple[tuple[Any, ...], ...]:
        """``(dimension names, sizes)`` of the enabled dimensions in mesh order (``()`` when none is), the
        arguments of torch's ``init_device_mesh`` (Accelerate's helper, kept for code that calls it)."""
        enabled = [(name, self._size(f"{name}_size")) for name in MESH_ORDER if self._size(f"{name}_size") > 1]
        return tuple(zip(*enabled))

    def resolved(self, world_size: int) -> ParallelismConfig:
        """A copy whose degrees multiply to ``world_size``: a -1 is filled in; all degrees 1 on more than one
        process means pure data parallelism (``dp_replicate_size = world``), as in Accelerate."""
        sizes = {name: getattr(self, name) for name in DEGREE_FIELDS}
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
        product = 1
        for value in sizes.values():
            product *= value
        if product != world_size:
            shown = " x ".join(f"{name}={value}" for name, value in sizes.items() if name in ("dp_replicate_size",
                               "dp_shard_size", "tp_size") or value != 1)
            raise ConfigError(f"ParallelismConfig: {shown} = {product} processes, but the run has {world_size}. "
                              "Adjust the degrees (or set one to -1 for the rest).")
        return dataclasses.replace(self, **sizes)

    def degrees(self) -> dict[str, int]:
        """``{"dp_replicate": ..., "dp_shard": ..., "cp": ..., "sp": ..., "tp": ...}`` in mesh order (call on a
        resolved config)."""
        return {name: self._size(f"{name}_size") for name in MESH_ORDER}

    def to_dict(self) -> dict[str, Any]:
        """The degrees, backends and the cp/sp handlers' settings (the TP handler is an object and is left out),
        for the launch YAML."""
        values = {name: getattr(self, name) for name in (*DEGREE_FIELDS, "cp_backend", "sp_backend")}
        for handler, settings in ((self.cp_handler, CP_SETTINGS), (self.sp_handler, SP_SETTINGS)):
            if handler is not None:
                values.update({name: getattr(handler, name) for name in settings})
        return values

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> ParallelismConfig:
        """Build from a launch YAML block or flags: keys ``parallelism_config_<field>`` (as Accelerate writes
        them) or the bare field names; an unknown key is an error naming the valid ones. The cp/sp settings
        build the handlers."""
        chosen: dict[str, Any] = {}
        for key, value in values.items():
            name = key[len(LAUNCH_PREFIX):] if key.startswith(LAUNCH_PREFIX) else key
            if name not in LAUNCH_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}; valid: {[LAUNCH_PREFIX + k for k in LAUNCH_KEYS]}.")
            if name in DEGREE_FIELDS:  # the backends and cp/sp settings are checked by the classes they build
                value = PARALLELISM_OPTIONS[name].read(value, LAUNCH_PREFIX + name, where)
            chosen[name] = value
        for handler, settings, factory in (("cp_handler", CP_SETTINGS, TorchContextParallelConfig),
                                           ("sp_handler", SP_SETTINGS, DeepSpeedSequenceParallelConfig)):
            given = {name: chosen.pop(name) for name in settings if chosen.get(name) is not None}
            for name in settings:
                chosen.pop(name, None)
            if given:
                try:
                    chosen[handler] = factory(**given)
                except ConfigError as error:
                    raise ConfigError(f"{where}: {error}") from None
        return cls(**chosen)

    def to_launch_dict(self) -> dict[str, Any]:
        """The ``parallelism_config:`` block as Accelerate writes it (``parallelism_config_<field>`` keys)."""
        return {LAUNCH_PREFIX + name: value for name, value in self.to_dict().items()}


def _handler(handler: Any, ours: type, settings: tuple[str, ...], on: bool, dimension: str) -> Any:
    """The handler as trainkit's class (Accelerate's object is read by its fields); a default one when the
    dimension is on; None, with a warning, for settings of a dimension of size 1 (they would do nothing)."""
    if not on:
        if handler is not None:
            warnings.warn(f"ParallelismConfig.{dimension}_handler is set but {dimension}_size is 1: it has no effect.",
                          UserWarning, stacklevel=4)
        return None
    if handler is None or isinstance(handler, ours):
        return ours() if handler is None else handler
    if isinstance(handler, Mapping):
        unknown = sorted(set(handler) - set(settings))
        if unknown:
            raise ConfigError(f"ParallelismConfig({dimension}_handler=...): unknown keys {unknown}; valid: "
                              f"{list(settings)}.")
        return ours(**handler)
    if not all(hasattr(handler, name) for name in settings):
        raise ConfigError(f"ParallelismConfig({dimension}_handler={type(handler).__name__}): expected a "
                          f"{ours.__name__} (fields {list(settings)}).")
    return ours(**{name: getattr(handler, name) for name in settings})


def _from_environment(name: str, value: Any) -> Any:
    """``value``, or when it is None the ``PARALLELISM_CONFIG_<NAME>`` variable (None when unset)."""
    return os.environ.get(ENV_PREFIX + name.upper()) if value is None else value


def _flag(name: str, value: Any) -> bool:
    """A boolean setting given as a bool or as launch-flag text (``true``/``false``)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"DeepSpeedSequenceParallelConfig: {name}={value!r} is not a boolean (true or false).")


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
