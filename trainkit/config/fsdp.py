"""FSDP options as plain data: parsed from Accelerate's ``fsdp_config`` keys, transformers' keys or flags.

This module never imports torch: the CLI validates a config file with it before any worker starts.
The engine turns an :class:`FSDPOptions` into FSDP2 calls (``trainkit.engine.strategies.fsdp.sharding``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError, check_choice, unknown_key_error
from .options import Option, boolean, declared_options, integer, optional
from .values import BOOLEAN_SPELLINGS

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")

# Keys that other tools write into fsdp_config and that mean nothing under FSDP2 (or on this hardware):
# accepted so their files load unchanged, and reported once as unused.
IGNORED_KEYS = frozenset(
    {"limit_all_gathers", "xla", "xla_fsdp_settings", "xla_fsdp_grad_ckpt", "xla_fsdp_v2", "version"}
)
# The one table of other spellings: each accepted key (with or without Accelerate's ``fsdp_`` prefix) -> the
# option's one internal name, the FSDPOptions field. The launch YAML and flags, TrainingArguments' fsdp_config
# and the plugin's Accelerate field names are all read through :func:`option_name`.
ALIASES = {
    "backward_prefetch_policy": "backward_prefetch",  # Accelerate's older launcher flag
    "cpu_offload": "offload_params",  # the plugin's field name; transformers' fsdp_config key
    "offload": "offload_params",  # transformers' fsdp word
    "transformer_cls_names_to_wrap": "transformer_layer_cls_to_wrap",  # the plugin's field name
    "reshard_after_forward": "sharding_strategy",  # FSDP2's boolean spelling of the strategy (own parser below)
}
PREFIX = "fsdp_"
"""Accelerate's prefix on fsdp_config keys and launcher flags (transformers accepts keys with or without it)."""


def option_name(raw_key: str) -> str:
    """The internal name (FSDPOptions field) for any accepted spelling of an option key.

    Strips the ``fsdp_`` prefix and applies :data:`ALIASES`; a key that names no option comes back as it
    is (stripped), for the caller's unknown-key or ignored-key handling.
    """
    key = raw_key[len(PREFIX):] if raw_key.startswith(PREFIX) else raw_key
    return ALIASES.get(key, key)


@dataclasses.dataclass
class FSDPOptions:
    """Every FSDP option trainkit acts on, with Accelerate's meaning (field names without ``fsdp_``).

    Each field is declared once with its :class:`~trainkit.config.options.Option` (default, help, choices, its
    one parser); the launch YAML key ``fsdp_<name>``, the flag ``--fsdp_<name>``, ``trainkit config``'s question,
    ``TrainingArguments(fsdp_config=...)``, the plugin and the resolver all read it from there.
    """

    sharding_strategy: str = Option(
        help=f"{' | '.join(SHARDING_STRATEGIES)} (or 1-5).", default="FULL_SHARD", choices=SHARDING_STRATEGIES,
        parse=lambda value, key, where: parse_sharding_strategy(value, key=key, where=where)).field()
    offload_params: bool = Option(help="Keep parameters, gradients and optimizer state on CPU.", default=False,
                                  parse=boolean).field()
    """Keep sharded parameters, gradients and optimizer state on CPU (FSDP2 ``CPUOffloadPolicy``)."""
    auto_wrap_policy: str | None = Option(
        help=f"{' | '.join(AUTO_WRAP_POLICIES)}.", choices=AUTO_WRAP_POLICIES,
        parse=optional(lambda value, key, where: check_choice(key, value, AUTO_WRAP_POLICIES, where=where))).field()
    """None picks transformer-based when the model declares ``_no_split_modules``, else no wrapping below the root."""
    transformer_layer_cls_to_wrap: list[str] | None = Option(
        help="Comma-separated layer class names to shard as units.",
        parse=lambda value, key, where: _class_names(value, key, where)).field()
    """Class names sharded as units under TRANSFORMER_BASED_WRAP; default: the model's ``_no_split_modules``."""
    min_num_params: int = Option(help="SIZE_BASED_WRAP threshold.", default=100_000_000,
                                 parse=lambda value, key, where: _parse_min_num_params(value, key, where)).field()
    """Under SIZE_BASED_WRAP, a module with at least this many (not yet wrapped) parameters becomes a unit."""
    backward_prefetch: str | None = Option(
        help=f"{' | '.join(BACKWARD_PREFETCH)}.", default="BACKWARD_PRE", choices=BACKWARD_PREFETCH,
        parse=lambda value, key, where: _parse_backward_prefetch(value, key, where)).field()
    """How far ahead FSDP2 all-gathers during backward."""
    forward_prefetch: bool = Option(help="Prefetch the next unit's parameters during forward.", default=False,
                                    parse=boolean).field()
    """Issue the next unit's all-gather during the current unit's forward."""
    state_dict_type: str = Option(help=f"{' | '.join(STATE_DICT_TYPES)}.", default="FULL_STATE_DICT",
                                  choices=STATE_DICT_TYPES).field()
    """What ``save_state`` writes for the model and optimizer."""
    cpu_ram_efficient_loading: bool = Option(help="Only rank 0 loads real weights.", default=False,
                                             parse=boolean).field()
    """Only rank 0 holds real weights at load time; the others build on the meta device."""
    sync_module_states: bool = Option(help="Broadcast rank 0's weights when sharding.", default=True,
                                      parse=boolean).field()
    """Broadcast rank 0's parameters and buffers when sharding (required by cpu_ram_efficient_loading)."""
    use_orig_params: bool = Option(help="Accepted (always true under FSDP2).", default=True, parse=boolean).field()
    """Accepted for compatibility: FSDP2 always exposes the original parameters (as DTensors)."""
    activation_checkpointing: bool = Option(help="Recompute activations of each unit in backward.", default=False,
                                            parse=boolean).field()
    """Recompute each wrapped unit's activations during backward instead of storing them."""
    hybrid_shard_group_size: int | None = Option(help="HYBRID_SHARD*: processes per sharding group.",
                                                 parse=optional(integer(1))).field()
    """HYBRID_SHARD*: processes per sharding group; default: the processes of one machine."""
    ignored_keys: list[str] = dataclasses.field(default_factory=list)
    """Keys that were accepted but have no effect (reported once, never an error)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "fsdp_config", *, wheres: Mapping[str, str] | None = None) -> None:
        """Parse every option in place (each with its one parser) and check the options against each other.

        ``where`` names the source in errors (e.g. ``fsdp_config (my.yaml)``); ``wheres`` can name a
        different source per option (field name -> where), for options merged from several layers.
        Raises :class:`ConfigError` naming the key, the value and what is valid.
        """
        def at(name: str) -> str:
            return (wheres or {}).get(name, where)

        for name, parse in _PARSERS.items():
            setattr(self, name, parse(getattr(self, name), name, at(name)))
        self.check_combination(where, wheres=wheres)

    def check_combination(self, where: str = "fsdp_config", *, wheres: Mapping[str, str] | None = None) -> None:
        """The checks that involve several options (each option's own value is already parsed)."""
        def at(name: str) -> str:
            return (wheres or {}).get(name, where)

        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            sources = sorted({at("cpu_ram_efficient_loading"), at("sync_module_states")})
            raise ConfigError(
                f"'cpu_ram_efficient_loading: true' in {' and '.join(sources)} needs 'sync_module_states: true': "
                "ranks other than 0 build the model without weights and receive rank 0's by broadcast."
            )

    @classmethod
    def from_parsed(cls, values: Mapping[str, Any], *, where: str = "fsdp_config",
                    wheres: Mapping[str, str] | None = None, ignored_keys: list[str] | None = None) -> FSDPOptions:
        """The defaults with ``values`` (field name -> value already read by :func:`parse_option`) applied,
        checked against each other; no value is parsed a second time."""
        options = cls(ignored_keys=list(ignored_keys or []))
        for name, value in values.items():
            setattr(options, name, value)
        options.check_combination(where, wheres=wheres)
        return options

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
        values, wheres, ignored = _parse_mapping(mapping, where, sources)
        return cls.from_parsed(values, where=where, wheres=wheres, ignored_keys=ignored)

    @classmethod
    def check_mapping(cls, mapping: Mapping[str, Any], *, where: str = "fsdp_config",
                      sources: Mapping[str, str] | None = None) -> None:
        """Parse ``mapping`` as :meth:`from_mapping` does, raising on a bad key or value, without building options."""
        _parse_mapping(mapping, where, sources)

    @classmethod
    def default_of(cls, name: str) -> Any:
        """An option's default value (without building an instance)."""
        return _DEFAULTS[name]

    @classmethod
    def help_of(cls, name: str) -> str:
        """An option's one-line help (its declaration's), shown for its launcher flag."""
        return _DECLARED[name].help

    def to_accelerate_dict(self) -> dict[str, Any]:
        """The ``fsdp_config`` mapping with Accelerate's prefixed keys, as ``trainkit config`` writes it."""
        return {f"fsdp_{name}": getattr(self, name) for name in self.field_names()}


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

    FSDP2's boolean, in Accelerate's spellings (``str_to_bool``: 1/0, yes/no, on/off, t/f, y/n): true =
    FULL_SHARD, false = SHARD_GRAD_OP; or FSDP1's strategy name or number (2-5; 1 is FULL_SHARD both ways).
    So ``1`` means FULL_SHARD whatever its type, as Accelerate's launcher (which passes "1" to its FSDP2
    plugin: True) and FSDP1 plugin (strategy 1) read it. torch's ``fully_shard`` would read an int 1 as
    "reshard to groups of 1 process", i.e. not at all: trainkit never hands this value to torch as an int.
    """
    if isinstance(value, bool):
        return "FULL_SHARD" if value else "SHARD_GRAD_OP"
    text = str(getattr(value, "name", value)).strip().lower()
    if text in BOOLEAN_SPELLINGS:
        return "FULL_SHARD" if BOOLEAN_SPELLINGS[text] else "SHARD_GRAD_OP"
    try:
        return parse_sharding_strategy(value, key=key, where=where)
    except ConfigError:
        raise ConfigError(
            f"Invalid value {value!r} for {key!r} in {where}: expected true/false (FSDP2) or a sharding "
            f"strategy ({', '.join(SHARDING_STRATEGIES)}, or 1-5).") from None


def _parse_mapping(mapping: Mapping[str, Any], where: str, sources: Mapping[str, str] | None
                   ) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Each key of an fsdp_config mapping parsed once: (values, where each came from, ignored raw keys)."""
    values: dict[str, Any] = {}
    wheres: dict[str, str] = {}
    ignored: list[str] = []
    for raw_key, value in mapping.items():
        key_where = (sources or {}).get(raw_key, where)
        if option_name(raw_key) in IGNORED_KEYS:
            ignored.append(raw_key)
            continue
        if option_name(raw_key) == "ignored_modules":  # `accelerate config` writes `fsdp_ignored_modules: null`
            if value is not None:
                raise ConfigError(f"{raw_key}={value!r} in {where}: give the modules to leave unsharded in the "
                                  "script, FullyShardedDataParallelPlugin(ignored_modules=[...]).")
            continue
        name, parsed = parse_option(raw_key, value, key_where)
        values[name] = parsed
        wheres[name] = key_where
    return values, wheres, ignored


def parse_option(raw_key: str, value: Any, where: str) -> tuple[str, Any]:
    """One option as written anywhere (YAML key, flag, TrainingArguments' fsdp_config key, plugin field) ->
    ``(internal name, parsed value)``. The one parser per key: every surface calls this.

    Raises :class:`ConfigError` for an unknown key (with a did-you-mean) or a bad value (naming the key).
    """
    name = option_name(raw_key)
    bare = raw_key[len(PREFIX):] if raw_key.startswith(PREFIX) else raw_key
    if bare == "reshard_after_forward":  # FSDP2's spelling has its own vocabulary (a boolean or a strategy)
        return name, parse_reshard_after_forward(value, key=raw_key, where=where)
    parse = _PARSERS.get(name)
    if parse is None:
        known = FSDPOptions.field_names()
        raise unknown_key_error(raw_key, [PREFIX + k for k in known] + list(ALIASES), where=where)
    return name, parse(value, name, where)


def _parse_backward_prefetch(value: Any, key: str, where: str) -> str:
    if value in (None, "", "NONE", "None", "none", False):
        value = "NO_PREFETCH"
    return check_choice(key, value, BACKWARD_PREFETCH, where=where)


def _parse_min_num_params(value: Any, key: str, where: str) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        raise ConfigError(f"Invalid value {value!r} for {key!r} in {where}: expected an integer.") from None


def _class_names(value: Any, key: str, where: str) -> list[str] | None:
    """Layer class names: a comma-separated string or a list of strings (None or empty: none given)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise ConfigError(f"Invalid value {value!r} for {key!r} in {where}: expected class "
                          "names, as a comma-separated string or a list of strings.")
    names = [name.strip() for name in value if name.strip()]
    return names or None


_DECLARED = declared_options(FSDPOptions)
# Each option's one parser, from its declaration: value, key (as named in errors), where -> the canonical value.
_PARSERS: dict[str, Callable[[Any, str, str], Any]] = {name: option.read for name, option in _DECLARED.items()}
_DEFAULTS = {name: option.default for name, option in _DECLARED.items()}
