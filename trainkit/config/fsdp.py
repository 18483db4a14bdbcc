"""FSDP options as plain data: parsed from Accelerate's ``fsdp_config`` keys, transformers' keys or flags.

This module never imports torch: the CLI validates a config file with it before any worker starts.
The engine turns an :class:`FSDPOptions` into FSDP2 calls (``trainkit.engine.strategies.fsdp.sharding``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, check_choice, unknown_key_error
from .values import to_bool, to_int

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")

# Keys that other tools write into fsdp_config and that mean nothing under FSDP2 (or on this hardware):
# accepted so their files load unchanged, and reported once as unused.
IGNORED_KEYS = frozenset(
    {"limit_all_gathers", "xla", "xla_fsdp_settings", "xla_fsdp_grad_ckpt", "xla_fsdp_v2", "version"}
)
# Other spellings of the same option, all normalised to the field name.
ALIASES = {
    "backward_prefetch_policy": "backward_prefetch",
    "cpu_offload": "offload_params",
    "offload": "offload_params",
    "transformer_cls_names_to_wrap": "transformer_layer_cls_to_wrap",
}


@dataclasses.dataclass
class FSDPOptions:
    """Every FSDP option trainkit acts on, with Accelerate's meaning (field names without ``fsdp_``)."""

    sharding_strategy: str = "FULL_SHARD"
    """FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD | HYBRID_SHARD_ZERO2 (or 1-5)."""
    offload_params: bool = False
    """Keep sharded parameters, gradients and optimizer state on CPU (FSDP2 ``CPUOffloadPolicy``)."""
    auto_wrap_policy: str | None = None
    """TRANSFORMER_BASED_WRAP | SIZE_BASED_WRAP | NO_WRAP; None picks transformer-based when the model
    declares ``_no_split_modules``, else no wrapping below the root."""
    transformer_layer_cls_to_wrap: list[str] | None = None
    """Class names sharded as units under TRANSFORMER_BASED_WRAP; default: the model's ``_no_split_modules``."""
    min_num_params: int = 100_000_000
    """Under SIZE_BASED_WRAP, a module with at least this many (not yet wrapped) parameters becomes a unit."""
    backward_prefetch: str | None = "BACKWARD_PRE"
    """BACKWARD_PRE | BACKWARD_POST | NO_PREFETCH: how far ahead FSDP2 all-gathers during backward."""
    forward_prefetch: bool = False
    """Issue the next unit's all-gather during the current unit's forward."""
    state_dict_type: str = "FULL_STATE_DICT"
    """FULL_STATE_DICT | SHARDED_STATE_DICT: what ``save_state`` writes for the model and optimizer."""
    cpu_ram_efficient_loading: bool = False
    """Only rank 0 holds real weights at load time; the others build on the meta device."""
    sync_module_states: bool = True
    """Broadcast rank 0's parameters and buffers when sharding (required by cpu_ram_efficient_loading)."""
    use_orig_params: bool = True
    """Accepted for compatibility: FSDP2 always exposes the original parameters (as DTensors)."""
    activation_checkpointing: bool = False
    """Recompute each wrapped unit's activations during backward instead of storing them."""
    hybrid_shard_group_size: int | None = None
    """HYBRID_SHARD*: processes per sharding group; default: the processes of one machine."""
    ignored_keys: list[str] = dataclasses.field(default_factory=list)
    """Keys that were accepted but have no effect (reported once, never an error)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "fsdp_config", *, wheres: Mapping[str, str] | None = None) -> None:
        """Normalise spellings in place and raise :class:`ConfigError` naming any invalid value.

        ``where`` names the source in errors (e.g. ``fsdp_config (my.yaml)``); ``wheres`` can name a
        different source per option (field name -> where), for options merged from several layers.
        """
        def at(name: str) -> str:
            return (wheres or {}).get(name, where)

        self.sharding_strategy = parse_sharding_strategy(self.sharding_strategy, key="sharding_strategy",
                                                         where=at("sharding_strategy"))
        if self.auto_wrap_policy is not None:
            self.auto_wrap_policy = check_choice("auto_wrap_policy", self.auto_wrap_policy, AUTO_WRAP_POLICIES,
                                                 where=at("auto_wrap_policy"))
        if self.backward_prefetch in (None, "", "NONE", "None", "none", False):
            self.backward_prefetch = "NO_PREFETCH"
        self.backward_prefetch = check_choice("backward_prefetch", self.backward_prefetch, BACKWARD_PREFETCH,
                                              where=at("backward_prefetch"))
        self.state_dict_type = check_choice("state_dict_type", self.state_dict_type, STATE_DICT_TYPES,
                                            where=at("state_dict_type"))
        self.transformer_layer_cls_to_wrap = _class_names(self.transformer_layer_cls_to_wrap,
                                                          at("transformer_layer_cls_to_wrap"))
        for flag in ("offload_params", "forward_prefetch", "cpu_ram_efficient_loading", "sync_module_states",
                     "use_orig_params", "activation_checkpointing"):
            setattr(self, flag, to_bool(flag, getattr(self, flag), at(flag)))
        try:
            self.min_num_params = int(float(self.min_num_params))
        except (TypeError, ValueError):
            raise ConfigError(f"Invalid value {self.min_num_params!r} for 'min_num_params' in "
                              f"{at('min_num_params')}: expected an integer.") from None
        if self.hybrid_shard_group_size is not None:
            self.hybrid_shard_group_size = to_int("hybrid_shard_group_size", self.hybrid_shard_group_size,
                                                  at("hybrid_shard_group_size"), minimum=1)
        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            sources = sorted({at("cpu_ram_efficient_loading"), at("sync_module_states")})
            raise ConfigError(
                f"'cpu_ram_efficient_loading: true' in {' and '.join(sources)} needs 'sync_module_states: true': "
                "ranks other than 0 build the model without weights and receive rank 0's by broadcast."
            )

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP2's name for the difference between FULL_SHARD-like and SHARD_GRAD_OP-like strategies."""
        return self.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys :meth:`from_mapping` accepts (each also with an ``fsdp_`` prefix)."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "ignored_keys"]

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, where: str = "fsdp_config",
                     sources: Mapping[str, str] | None = None) -> FSDPOptions:
        """Build from a mapping whose keys may carry the ``fsdp_`` prefix (Accelerate) or not (transformers).

        Unknown keys raise :class:`ConfigError` with a did-you-mean; keys of other tools' FSDP
        implementations that mean nothing here are kept in ``ignored_keys``. Errors name ``where``, or
        ``sources[raw_key]`` for a key that came from elsewhere (a flag beside a file).
        """
        known = set(cls.field_names())
        values: dict[str, Any] = {}
        wheres: dict[str, str] = {}
        ignored: list[str] = []
        for raw_key, value in mapping.items():
            key = raw_key[len("fsdp_"):] if raw_key.startswith("fsdp_") else raw_key
            key = ALIASES.get(key, key)
            key_where = (sources or {}).get(raw_key, where)
            if key == "reshard_after_forward":
                values["sharding_strategy"] = parse_reshard_after_forward(value, key=raw_key, where=key_where)
                wheres["sharding_strategy"] = key_where
            elif key in known:
                values[key] = value
                wheres[key] = key_where
            elif key in IGNORED_KEYS:
                ignored.append(raw_key)
            else:
                raise unknown_key_error(raw_key, [f"fsdp_{k}" for k in known] + list(ALIASES), where=key_where)
        options = cls(ignored_keys=ignored)  # the defaults, then the given values checked against their sources
        for name, value in values.items():
            setattr(options, name, value)
        options.validate(where, wheres=wheres)
        return options

    def to_accelerate_dict(self) -> dict[str, Any]:
        """The ``fsdp_config`` mapping with Accelerate's prefixed keys, as ``trainkit config`` writes it."""
        return {f"fsdp_{name}": getattr(self, name) for name in self.field_names()}


# Accelerate's spellings of a boolean for reshard_after_forward (its str_to_bool), and how each reads.
_RESHARD_BOOLEANS = {**dict.fromkeys(("y", "yes", "t", "true", "on", "1"), True),
                     **dict.fromkeys(("n", "no", "f", "false", "off", "0"), False)}


def parse_sharding_strategy(value: Any, *, key: str, where: str) -> str:
    """A sharding strategy by name (any case) or by FSDP's number 1-5, as its canonical name."""
    name = getattr(value, "name", value)  # torch's ShardingStrategy enum
    if isinstance(name, int) or (isinstance(name, str) and name.strip().isdigit()):
        index = int(name)
        if not 1 <= index <= len(SHARDING_STRATEGIES):
            raise ConfigError(
                f"Invalid value {value!r} for {key!r} in {where}: numbers run 1-5 "
                f"({', '.join(f'{i + 1}={s}' for i, s in enumerate(SHARDING_STRATEGIES))}).")
        return SHARDING_STRATEGIES[index - 1]
    return check_choice(key, str(name).strip(), SHARDING_STRATEGIES, where=where)


def parse_reshard_after_forward(value: Any, *, key: str, where: str) -> str:
    """``reshard_after_forward`` as the sharding strategy it means; the one parser for every source.

    FSDP2's boolean (True = FULL_SHARD, False = SHARD_GRAD_OP, in Accelerate's spellings: 1/0, yes/no,
    on/off, ...) or FSDP1's strategy name or number (2-5; 1 is FULL_SHARD both ways).
    """
    if isinstance(value, bool):
        return "FULL_SHARD" if value else "SHARD_GRAD_OP"
    text = str(getattr(value, "name", value)).strip().lower()
    if text in _RESHARD_BOOLEANS:
        return "FULL_SHARD" if _RESHARD_BOOLEANS[text] else "SHARD_GRAD_OP"
    try:
        return parse_sharding_strategy(value, key=key, where=where)
    except ConfigError:
        raise ConfigError(
            f"Invalid value {value!r} for {key!r} in {where}: expected true/false (FSDP2) or a sharding "
            f"strategy ({', '.join(SHARDING_STRATEGIES)}, or 1-5).") from None


def _class_names(value: Any, where: str) -> list[str] | None:
    """Layer class names: a comma-separated string or a list of strings (None or empty: none given)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise ConfigError(f"Invalid value {value!r} for 'transformer_layer_cls_to_wrap' in {where}: expected class "
                          "names, as a comma-separated string or a list of strings.")
    names = [name.strip() for name in value if name.strip()]
    return names or None
