"""``FullyShardedDataParallelPlugin``: Accelerate's FSDP plugin (field names and accepted values) over FSDP2.

The plugin normalises whatever the user passed — strings in any case, strategy numbers 1-5, torch's
FSDP1 enums (``ShardingStrategy``, ``BackwardPrefetch``, ``StateDictType``), ``CPUOffload`` objects,
``FullStateDictConfig`` / ``FullOptimStateDictConfig`` objects, a wrap-policy callable — into one
validated :class:`trainkit.config.fsdp.FSDPOptions`, which :class:`FSDPStrategy` turns into FSDP2 calls.
Validation happens here, at construction, so a typo fails before any model is touched.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainkit.config.errors import ConfigError
from trainkit.config.fsdp import FSDPOptions, option_name, parse_option
from trainkit.config.precision import parse_mixed_precision
from trainkit.engine.precision.registry import compute_dtype
from trainkit.engine.strategies.fsdp.pretrained_loading import load_on_rank0_only

logger = logging.getLogger(__name__)


def _enum_name(value: Any) -> Any:
    """torch's FSDP1 enums by name (``ShardingStrategy._HYBRID_SHARD_ZERO2`` -> "HYBRID_SHARD_ZERO2")."""
    return value.name.lstrip("_") if isinstance(value, enum.Enum) else value


# Fields that are not FSDP options (or not only): read by the strategy as they are, never parsed as options.
_PLUGIN_ONLY = frozenset({"fsdp_version", "mixed_precision_policy", "ignored_modules", "state_dict_config",
                          "optim_state_dict_config", "limit_all_gathers", "param_init_fn",
                          "activation_checkpointing_offload", "options", "explicit_options"})


@dataclasses.dataclass
class FullyShardedDataParallelPlugin:
    """FSDP options with Hugging Face Accelerate's field names, run on FSDP2 (``fully_shard``).

    Pass it as ``Accelerator(fsdp_plugin=...)``. Every field left at None is "not set": the launcher's
    FSDP option of that name applies, else trainkit's default (docs/engine.md, "Where the configuration
    comes from").
    """

    fsdp_version: int | None = None
    """Accepted: trainkit always runs FSDP2; 1 is reported once and treated as 2."""
    sharding_strategy: Any = None
    """FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD | HYBRID_SHARD_ZERO2, a number 1-5 or torch's enum."""
    reshard_after_forward: bool | str | None = None
    """Accelerate's FSDP2 spelling: True = FULL_SHARD, False = SHARD_GRAD_OP (overrides sharding_strategy)."""
    backward_prefetch: Any = None
    """BACKWARD_PRE | BACKWARD_POST | NO_PREFETCH (or torch's ``BackwardPrefetch``)."""
    mixed_precision_policy: Any = None
    """A ``MixedPrecisionPolicy``, FSDP1 ``MixedPrecision``, dict of dtypes, or "bf16"/"fp16"; default: the
    Accelerator's ``mixed_precision`` (parameters in that dtype, reductions and outputs in float32)."""
    auto_wrap_policy: Any = None
    """TRANSFORMER_BASED_WRAP | SIZE_BASED_WRAP | NO_WRAP, or a policy callable
    ``(module, recurse, nonwrapped_numel) -> bool``; None: the model's ``_no_split_modules`` if any."""
    cpu_offload: Any = None
    """Offload sharded parameters, gradients and optimizer state to CPU: a bool or torch's ``CPUOffload``."""
    ignored_modules: Iterable[torch.nn.Module] | None = None
    """Modules whose parameters FSDP neither shards nor synchronises."""
    state_dict_type: Any = None
    """FULL_STATE_DICT | SHARDED_STATE_DICT (or torch's ``StateDictType``): what ``save_state`` writes."""
    state_dict_config: Any = None
    """torch's ``FullStateDictConfig(offload_to_cpu=, rank0_only=)`` (or ``ShardedStateDictConfig``):
    where ``get_state_dict`` puts full tensors. Default: on CPU, on rank 0 only."""
    optim_state_dict_config: Any = None
    """torch's ``FullOptimStateDictConfig(offload_to_cpu=, rank0_only=)``: where the strategy's full optimizer
    state dict (``optimizer_state_dict(full=True)``) puts its tensors. Default (torch's): every rank, on device."""
    limit_all_gathers: bool = True
    """Accepted for compatibility; FSDP2 bounds in-flight all-gathers itself (False gets a one-line notice)."""
    use_orig_params: bool | None = None
    """Accepted for compatibility; FSDP2 always exposes the original parameters (False gets a one-line notice
    when the Accelerator starts)."""
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    """Accepted as None only: an FSDP1 hook for materialising meta-device modules. FSDP2 materialises them
    itself (``cpu_ram_efficient_loading``: empty storage, then rank 0's weights by broadcast)."""
    sync_module_states: bool | None = None
    """Broadcast rank 0's parameters and buffers before sharding (default true)."""
    forward_prefetch: bool | None = None
    """All-gather the next unit's parameters before running the current unit's forward."""
    activation_checkpointing: bool | None = None
    """Recompute each wrapped unit's activations during backward."""
    activation_checkpointing_offload: bool | None = None
    """Accepted as None/False only: trainkit's activation checkpointing keeps the saved inputs on the device."""
    cpu_ram_efficient_loading: bool | None = None
    """Only rank 0 needs real weights: other ranks may build the model on the meta device."""
    transformer_cls_names_to_wrap: list[str] | str | None = None
    """Class names wrapped as units under TRANSFORMER_BASED_WRAP (comma-separated string or list)."""
    min_num_params: int | None = None
    """Parameter threshold of SIZE_BASED_WRAP."""
    hybrid_shard_group_size: int | None = dataclasses.field(default=None, kw_only=True)
    """HYBRID_SHARD*: processes per sharding group (default: the processes of one machine).
    Keyword-only: a trainkit extension after Accelerate's parameters."""
    options: FSDPOptions = dataclasses.field(init=False, repr=False)
    """The validated options every other field resolved to (the plugin's own values over trainkit's defaults)."""
    explicit_options: dict[str, Any] = dataclasses.field(init=False, repr=False)
    """The options this plugin was given (normalised), keyed by FSDPOptions field: the explicit layer of the
    engine's configuration, so that launcher values fill only the options the plugin leaves unset."""

    def __post_init__(self) -> None:
        where = "FullyShardedDataParallelPlugin(...)"
        self._refuse_fsdp1_only_options(where)
        values = self._given_options(where)
        if values.get("cpu_ram_efficient_loading") and "sync_module_states" not in values:
            values["sync_module_states"] = True  # the only way the other ranks get weights
        options = FSDPOptions.from_parsed(values, where=where)
        self.options = options
        self.explicit_options = dict(values)
        self._write_back_normalised()
        self.param_dtype(None)  # validates mixed_precision_policy now, not at prepare
        if self.limit_all_gathers is False:  # use_orig_params=False is announced with the resolved config
            logger.warning("trainkit: FullyShardedDataParallelPlugin(limit_all_gathers=False) has no effect: "
                           "FSDP2 bounds in-flight all-gathers itself.")
        if self.fsdp_version not in (None, 2, "2"):
            logger.warning("fsdp_version=%s requested: trainkit runs FSDP2 (fully_shard) only.", self.fsdp_version)
        if self.options.cpu_ram_efficient_loading:
            load_on_rank0_only()  # before the script's from_pretrained: other ranks build on meta

    def _given_options(self, where: str) -> dict[str, Any]:
        """The options this plugin's fields set, each read by its one parser (``parse_option``), keyed by
        internal name. A field maps to the option its name spells (``config.fsdp.ALIASES``: ``cpu_offload``,
        ``transformer_cls_names_to_wrap``, ``reshard_after_forward``); what only a plugin can hold (torch's
        enums and config objects, a policy callable) is reduced to the plain value first."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            if field.name in _PLUGIN_ONLY or option_name(field.name) not in FSDPOptions.field_names():
                continue
            if field.name == "sharding_strategy" and self.reshard_after_forward is not None:
                continue  # Accelerate: reshard_after_forward (FSDP2's spelling) overrides sharding_strategy
            value = self._plain_value(field.name, where)
            if value is not None:
                name, parsed = parse_option(field.name, value, where)
                values[name] = parsed
        return values

    def _plain_value(self, field_name: str, where: str) -> Any:
        """A field's value as plain data: torch's enums by name, CPUOffload by its flag, a config object by kind."""
        value = getattr(self, field_name)
        if field_name == "cpu_offload":
            return getattr(value, "offload_params", value)
        if field_name == "auto_wrap_policy":
            if isinstance(value, (str, enum.Enum)) or value is None:
                return _enum_name(value)
            if not callable(value):
                raise ConfigError(f"auto_wrap_policy in {where} must be a name or a policy callable, got {value!r}.")
            return None  # a callable is used as it is (wrap_policy); the option stays "decide from the model"
        if field_name == "state_dict_type":
            value = _enum_name(value)
            if value is None and self.state_dict_config is not None:
                # A config object alone says which kind is wanted, as in torch's FSDP.set_state_dict_type.
                value = "SHARDED_STATE_DICT" if "Sharded" in type(self.state_dict_config).__name__ else "FULL_STATE_DICT"
            if value == "LOCAL_STATE_DICT":
                raise ConfigError(f"state_dict_type LOCAL_STATE_DICT in {where} has no FSDP2 equivalent: "
                                  "use SHARDED_STATE_DICT (resharding on load) or FULL_STATE_DICT.")
            return value
        return _enum_name(value)

    def _refuse_fsdp1_only_options(self, where: str) -> None:
        """Accelerate's options that trainkit's FSDP2 path cannot honour: the default only, else a clear error."""
        if self.param_init_fn is not None:
            raise ConfigError(
                f"param_init_fn in {where} is not supported: it is an FSDP1 hook for materialising modules built on "
                "the meta device, and trainkit runs FSDP2 only, which materialises them itself (empty storage, then "
                "rank 0's weights by broadcast with cpu_ram_efficient_loading=True). Leave param_init_fn=None.")
        if self.activation_checkpointing_offload:
            if not self.activation_checkpointing:
                raise ConfigError(f"activation_checkpointing_offload=True in {where} requires "
                                  "activation_checkpointing=True.")
            raise ConfigError(
                f"activation_checkpointing_offload=True in {where} is not supported: trainkit's activation "
                "checkpointing recomputes each wrapped unit from inputs kept on the device and does not move them to "
                "CPU memory. Leave activation_checkpointing_offload unset (False).")

    def _write_back_normalised(self) -> None:
        """Show the resolved values in the plugin's own fields (Accelerate's scripts read them)."""
        options = self.options
        for field in dataclasses.fields(self):
            name = option_name(field.name)
            if field.name in _PLUGIN_ONLY or field.name == "reshard_after_forward" \
                    or name not in FSDPOptions.field_names():
                continue
            if field.name == "auto_wrap_policy" and callable(self.auto_wrap_policy) \
                    and not isinstance(self.auto_wrap_policy, (str, enum.Enum)):
                continue  # the user's callable stays
            setattr(self, field.name, getattr(options, name))
        self.reshard_after_forward = options.reshard_after_forward  # FSDP2's boolean view of the strategy
        self.activation_checkpointing_offload = False  # the only value trainkit accepts (refused above otherwise)

    @classmethod
    def from_options(cls, options: FSDPOptions) -> FullyShardedDataParallelPlugin:
        """A plugin whose every option is given by ``options`` (for scripts that hold :class:`FSDPOptions`).

        The engine itself never round-trips through a plugin: launcher and ``TrainingArguments`` options go
        from the configuration resolver straight to the FSDP strategy."""
        given = {field.name: getattr(options, option_name(field.name)) for field in dataclasses.fields(cls)
                 if field.init and field.name not in _PLUGIN_ONLY and field.name != "reshard_after_forward"
                 and option_name(field.name) in FSDPOptions.field_names()}
        return cls(**given)

    @classmethod
    def showing(cls, options: FSDPOptions) -> FullyShardedDataParallelPlugin:
        """A plugin whose fields show ``options`` and whose ``options`` *is* that object (nothing parsed again).

        What ``accelerator.state.fsdp_plugin`` is when FSDP came from the launcher or ``TrainingArguments``
        rather than from a plugin: Accelerate builds that plugin from the launcher's settings, so scripts read
        the options in force there."""
        plugin = cls.__new__(cls)
        for field in dataclasses.fields(cls):
            if field.init:
                setattr(plugin, field.name, None if field.default is dataclasses.MISSING else field.default)
        plugin.options = options
        plugin.explicit_options = {}
        plugin._write_back_normalised()
        return plugin

    # -- what the strategy reads ---------------------------------------------------------------------
    @property
    def wrap_policy(self) -> str | Callable[..., bool] | None:
        """The auto-wrap policy: a name, a callable, or None (decided from the model)."""
        if callable(self.auto_wrap_policy) and not isinstance(self.auto_wrap_policy, (str, enum.Enum)):
            return self.auto_wrap_policy
        return self.options.auto_wrap_policy

    def param_dtype(self, default: torch.dtype | None) -> torch.dtype | None:
        """The compute dtype ``mixed_precision_policy`` asks for, or ``default`` (the Accelerator's) when unset."""
        policy = self.mixed_precision_policy
        if policy is None:
            return default
        if isinstance(policy, str):
            mode = parse_mixed_precision(policy, "FullyShardedDataParallelPlugin(mixed_precision_policy=...)",
                                         key="mixed_precision_policy")
            return compute_dtype(mode)
        if isinstance(policy, dict):
            return policy.get("param_dtype")
        return getattr(policy, "param_dtype", None)

    def explicit_mp_policy(self) -> Any:
        """The user's own ``MixedPrecisionPolicy`` object, when they passed one (used as is)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return policy
        if isinstance(policy, dict):
            return MixedPrecisionPolicy(**policy)
        return None

    @property
    def state_dict_rank0_only(self) -> bool:
        """Whether full model state dicts exist on rank 0 only (torch's default config says yes)."""
        return bool(getattr(self.state_dict_config, "rank0_only", True))

    @property
    def state_dict_offload_to_cpu(self) -> bool:
        """Whether full model state dicts are moved to CPU."""
        return bool(getattr(self.state_dict_config, "offload_to_cpu", True))

    @property
    def optim_state_dict_rank0_only(self) -> bool:
        """Whether full optimizer state dicts exist on rank 0 only (default, as torch's config: no)."""
        return bool(getattr(self.optim_state_dict_config, "rank0_only", False))

    @property
    def optim_state_dict_offload_to_cpu(self) -> bool:
        """Whether full optimizer state dicts are moved to CPU (default, as torch's config: no)."""
        return bool(getattr(self.optim_state_dict_config, "offload_to_cpu", False))

    def __repr__(self) -> str:
        return f"FullyShardedDataParallelPlugin({self.options!r})"
