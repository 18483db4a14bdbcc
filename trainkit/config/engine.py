"""The engine's configuration, resolved once: explicit arguments > the launcher's config > defaults.

Every setting the engine takes from outside the script's own objects lives in :class:`EngineConfig`, a
frozen record built by :func:`resolve_engine_config` and by nothing else. Its inputs are

* explicit settings: what the script passed (``Accelerator(...)`` arguments, plugins, the
  ``TrainingArguments`` fields it set), already projected into :class:`Setting` values keyed by field
  name (FSDP options as ``fsdp.<option>``);
* the launcher's config (``trainkit launch``'s hand-off file) — read here and nowhere else;
* the defaults of :class:`EngineConfig` and :class:`FSDPOptions`.

For every key the first of those three that has a value wins, and the config remembers where each value
came from (``provenance``). When an explicit value disagrees with a value the launcher was *given* (by a
flag or a config file, not by its own defaults), ``notices`` holds one line saying which won.

Adding a source: write a function ``LaunchConfig -> dict[str, Setting]`` and add it to
``LAUNCHER_MAPPINGS`` (a launcher section such as ``deepspeed_config``), or project the new plugin into
the explicit settings where the engine builds them (``trainkit.engine.accelerator_parts.configuration``). Adding a key: a
field below declared with an :class:`~trainkit.config.options.Option` (its parser comes with it); a key the
launcher also takes shares the launch config's ``Option`` (``config/engine_options.py``) and is handed over by
that alone; the ``Option`` also names its ``Accelerator(...)`` keyword and ``TrainingArguments`` fields, which both
mappings read (``Keyword``).
No torch here.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

from .deepspeed import DeepSpeedSettings, engine_values
from .dynamo import TorchDynamoPlugin
from .errors import ConfigError
from .fsdp import FSDPOptions
from .handoff import load_launch_config_from_env
from .launch import DEFAULT_SOURCE, LaunchConfig
from .parallelism import ParallelismConfig
from .engine_options import COLLECTIVE_TIMEOUT, GRADIENT_ACCUMULATION_STEPS, USE_CPU
from .options import Option, declared_options
from .precision import MIXED_PRECISION, declaration_for_options, option_blocks
from .values import to_bool

logger = logging.getLogger("trainkit.config")

PRECEDENCE = ("explicit", "launcher", "default")
"""The one rule, highest first, for every key of :class:`EngineConfig` and every FSDP option."""
FSDP_PREFIX = "fsdp."
_FROM_HANDOFF: Any = object()  # "read the launcher's hand-off file" (the normal case)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One value offered for a key, with the words that say where it came from."""

    value: Any
    source: str
    """e.g. ``"Accelerator(mixed_precision=)"``, ``"launcher flag --mixed_precision"``, ``"default"``."""
    parsed: bool = False
    """The value is already in its canonical form (the launcher's config parsed it by the same declaration), so
    the resolver takes it as it is instead of parsing it a second time."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """What the engine runs with, each value resolved once (see the module docstring for the rule)."""

    mixed_precision: str = MIXED_PRECISION.field()
    """A mode of ``config/precision.py``: autocast dtype (and loss scaling under fp16)."""
    gradient_accumulation_steps: int = GRADIENT_ACCUMULATION_STEPS.field()
    """Micro-batches per optimizer step."""
    use_cpu: bool = USE_CPU.field()
    """Compute on CPU even where a GPU exists."""
    collective_timeout: float = COLLECTIVE_TIMEOUT.field()
    """Seconds before a collective that never completes fails the job (declared in ``config/engine_options.py``)."""
    fsdp: FSDPOptions | None = None
    """FSDP options when the model is to be sharded, else None. Read-only."""
    dynamo: TorchDynamoPlugin | None = None
    """torch.compile settings for prepared models, or None (no compilation). Read-only."""
    deepspeed: DeepSpeedSettings | None = None
    """A DeepSpeed config, translated (config/deepspeed.py): its ZeRO stage, precision and accumulation are
    already in the fields above; the rest (clipping, optimizer/scheduler blocks, batch sizes) is here."""
    parallelism: ParallelismConfig | None = None
    """The parallel degrees (data replicas x shards x tensor parallel) when a ParallelismConfig was given (the
    script's, or the launcher's ``parallelism_config:`` block), else None. Not yet resolved against the world."""
    precision_options: Any = None
    """The mixed precision's own settings (an instance of the options class its declaration in
    ``config/precision.py`` names), or None when the mode has none; the precision class receives it."""
    elastic: bool = False
    """The launcher runs an elastic job (``num_machines MIN:MAX``): the workers restart on every membership change,
    also where no worker failed, so a run resumes from its latest checkpoint by itself (and starts afresh when
    there is none yet) with the same global batch."""
    provenance: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    """Where each value came from, keyed by field name and ``fsdp.<option>``."""
    notices: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    """At most one line: the explicit values that overrode different launcher values."""

    def __getstate__(self) -> dict[str, Any]:
        # The read-only provenance view cannot be pickled or deep-copied; its dict can (Accelerator pickling).
        return {**self.__dict__, "provenance": dict(self.provenance)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, types.MappingProxyType(value) if key == "provenance" else value)

    def source_of(self, key: str) -> str:
        """Where ``key`` (a field name or ``fsdp.<option>``) came from."""
        return self.provenance.get(key, DEFAULT_SOURCE)

    def replace(self, source: str, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` applied, each recorded as coming from ``source``."""
        provenance = dict(self.provenance)
        provenance.update({key: source for key in changes})
        return dataclasses.replace(self, provenance=types.MappingProxyType(provenance), **changes)

    def describe(self) -> list[str]:
        """One ``key = value  (source)`` line per setting, FSDP options indented below ``fsdp``."""
        lines = []
        for name in _FIELDS:
            value = getattr(self, name)
            shown = _shown(name, value)
            lines.append(f"{name} = {shown}  ({self.source_of(name)})")
            if name == "fsdp" and value is not None:
                for option in FSDPOptions.field_names():
                    key = FSDP_PREFIX + option
                    lines.append(f"  {option} = {getattr(value, option)}  ({self.source_of(key)})")
        return lines

    def summary(self) -> str:
        """The whole config on one line, for a debug log."""
        return "; ".join(line.strip() for line in self.describe())


def _shown(name: str, value: Any) -> Any:
    if name == "fsdp":
        return "off" if value is None else "on"
    if name == "dynamo":
        return "off" if value is None else f"{value.backend} (regional: {value.use_regional_compilation})"
    if name == "deepspeed":
        return "off" if value is None else f"ZeRO stage {value.zero_stage}"
    if name == "precision_options":
        return "none" if value is None else repr(value)
    if name == "parallelism":
        return "off" if value is None else ", ".join(f"{k}={v}" for k, v in value.to_dict().items() if v not in (1, None))
    return value


_FIELDS = tuple(field.name for field in dataclasses.fields(EngineConfig) if field.name not in ("provenance", "notices"))
_SHARED = {name: option for name, option in declared_options(EngineConfig).items()
           if declared_options(LaunchConfig).get(name) is option}
"""The settings the launcher and the engine share (one declaration each): the launcher hands them over as they are."""


def _declared_parser(name: str, option: Option) -> Callable[[Any, str], Any]:
    return lambda value, where: option.read(value, name, where)


_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    **{name: _declared_parser(name, option) for name, option in declared_options(EngineConfig).items()},
    # A layer may hand over its whole FSDPOptions as the value of "fsdp" ("on, with these"), see _fsdp_options.
    "fsdp": lambda value, where: True if isinstance(value, FSDPOptions) else to_bool("fsdp", value, where),
    "elastic": lambda value, where: to_bool("elastic", value, where),
    "dynamo": lambda value, where: value if value is not None and value.enabled else None,
    "parallelism": lambda value, where: parse_parallelism(value, where),
    "precision_options": lambda value, where: value,  # an options object, parsed by its declaration where it entered
}


def parse_parallelism(value: Any, where: str) -> ParallelismConfig | None:
    """A ParallelismConfig (Accelerate's object is read by its fields), a mapping of its fields, or None."""
    if value is None or isinstance(value, ParallelismConfig):
        return value
    if isinstance(value, Mapping):
        return ParallelismConfig.from_mapping(value, where)
    fields = ParallelismConfig.__dataclass_fields__
    if all(hasattr(value, name) for name in ("dp_replicate_size", "dp_shard_size", "tp_size")):
        return ParallelismConfig(**{name: getattr(value, name) for name in fields if hasattr(value, name)})
    raise ConfigError(f"{where}: parallelism_config must be a ParallelismConfig (trainkit.ParallelismConfig or "
                      f"Accelerate's), got {type(value).__name__}.")


def launcher_source(launch_source: str, key: str) -> str:
    """The words for a value the launcher was given: ``launcher flag --key`` or ``launcher config <file>``."""
    if launch_source == "flag":
        return f"launcher flag --{key}"
    if launch_source.startswith("flag "):  # another spelling of the flag, as typed (torchrun's --nnodes)
        return f"launcher {launch_source}"
    return f"launcher config {launch_source}"


def _plain_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    settings = {}
    for name in _SHARED:
        source = launch.source_of(name)
        if source != DEFAULT_SOURCE:  # the launcher's own defaults are not a request
            settings[name] = Setting(getattr(launch, name), launcher_source(source, name), parsed=True)
    return settings


def _fsdp_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    if launch.fsdp_config is None:
        return {}
    source = launch.source_of("distributed_type")
    settings = {"fsdp": Setting(launch.fsdp_config,
                                launcher_source(source, "use_fsdp" if source == "flag" else "distributed_type"))}
    for option in FSDPOptions.field_names():
        option_source = launch.source_of(f"fsdp_config.fsdp_{option}")
        if option_source != DEFAULT_SOURCE:
            settings[FSDP_PREFIX + option] = Setting(getattr(launch.fsdp_config, option),
                                                     launcher_source(option_source, f"fsdp_{option}"))
    return settings


def _dynamo_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    if launch.dynamo_config is None:
        return {}
    source = launch.source_of("dynamo_config")
    return {"dynamo": Setting(TorchDynamoPlugin.from_config(launch.dynamo_config, where=f"dynamo_config ({source})"),
                              launcher_source(source, "dynamo_backend" if source == "flag" else "dynamo_config"))}


def _deepspeed_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    plugin = launch.deepspeed_plugin()
    if plugin is None:
        return {}
    source = launcher_source(launch.source_of("deepspeed_config"), "use_deepspeed")
    values = engine_values(plugin.deepspeed_config, where=f"deepspeed_config ({source})")
    return {key: Setting(value, f"{source} (DeepSpeed)") for key, value in values.items()}


def _parallelism_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    config = launch.parallelism()
    if config is None:
        return {}
    return {"parallelism": Setting(config, launcher_source(launch.source_of("parallelism_config"), "parallelism_config"))}


def _precision_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    if not launch.precision_config:
        return {}
    (block, values), = launch.precision_config.items()  # the chosen mode's block only (LaunchConfig keeps one)
    _, declaration = option_blocks()[block]
    source = launcher_source(launch.source_of("precision_config"), block)
    return {"precision_options": Setting(declaration.read_options(values, where=f"{block} ({source})"), source)}


def _elastic_launch_settings(launch: LaunchConfig) -> dict[str, Setting]:
    if not launch.elastic:
        return {}
    source = launcher_source(launch.source_of("min_machines"), "num_machines")
    return {"elastic": Setting(True, f"{source} {launch.machine_range}")}


LAUNCHER_MAPPINGS: list[Callable[[LaunchConfig], dict[str, Setting]]] = [
    _plain_launch_settings, _fsdp_launch_settings, _dynamo_launch_settings, _deepspeed_launch_settings,
    _parallelism_launch_settings, _precision_launch_settings, _elastic_launch_settings]
"""How the launcher's config becomes settings: one function per section (add DeepSpeed's here)."""


def launcher_settings(launch: LaunchConfig | None) -> dict[str, Setting]:
    """The settings the launcher was given (flags, config files), keyed like the explicit ones."""
    settings: dict[str, Setting] = {}
    if launch is not None:
        for mapping in LAUNCHER_MAPPINGS:
            settings.update(mapping(launch))
    return settings


def resolve_engine_config(explicit: Mapping[str, Setting] | None = None, *,
                          launch: LaunchConfig | None = _FROM_HANDOFF) -> EngineConfig:
    """Resolve every engine setting once: ``explicit`` > the launcher's config > defaults.

    ``explicit`` holds only what the script set (a key absent means "not set", which is not the same as
    a default value). ``launch`` defaults to the hand-off file ``trainkit launch`` wrote for this
    process (none when the script was not launched by it). Bad values raise ``ConfigError`` naming the
    key, the value, where it came from and the valid choices.
    """
    explicit = dict(explicit or {})
    unknown = [key for key in explicit if key not in _FIELDS and not key.startswith(FSDP_PREFIX)]
    if unknown:
        raise ValueError(f"resolve_engine_config: unknown keys {unknown}; known: {list(_FIELDS)} and fsdp.<option>.")
    launched = launcher_settings(load_launch_config_from_env() if launch is _FROM_HANDOFF else launch)
    layers = (explicit, launched)
    values: dict[str, Any] = {}
    provenance: dict[str, str] = {}
    overridden: list[str] = []
    for key in list(_FIELDS) + _fsdp_keys(layers):
        winner = next((layer[key] for layer in layers if key in layer), None)
        if winner is None:
            provenance[key] = DEFAULT_SOURCE
            continue
        parse = _PARSERS.get(key)
        values[key] = parse(winner.value, winner.source) if parse and not winner.parsed else winner.value
        provenance[key] = winner.source
        if key in explicit and key in launched and _differs(key, explicit[key].value, launched[key].value):
            overridden.append(f"{key}={values[key]!r} from {winner.source} overrides "
                              f"{launched[key].value!r} from {launched[key].source}")
    offered = [layer["fsdp"].value for layer in layers if isinstance(layer.get("fsdp", Setting(None, "")).value, FSDPOptions)]
    fsdp = _fsdp_options(values, provenance, offered)
    _check_precision_options(values, provenance)
    notices = ("trainkit: explicit settings win over the launcher's: " + "; ".join(overridden) + ".",) if overridden else ()
    config = EngineConfig(
        **{name: values[name] for name in _FIELDS if name in values and name != "fsdp"},
        fsdp=fsdp, provenance=types.MappingProxyType(provenance), notices=notices,
    )
    logger.debug("trainkit engine config: %s", config.summary())
    return config


def _check_precision_options(values: Mapping[str, Any], provenance: Mapping[str, str]) -> None:
    """Options given for one mode while another runs are an error naming both (never dropped silently)."""
    options = values.get("precision_options")
    if options is None:
        return
    mode = values.get("mixed_precision", MIXED_PRECISION.default)
    owner = declaration_for_options(options)
    if owner is None or owner[0] != mode:
        raise ConfigError(f"{type(options).__name__} ({provenance['precision_options']}) configures mixed precision "
                          f"{owner[0] if owner else '(none)'!r}, but mixed_precision is {mode!r} "
                          f"({provenance.get('mixed_precision', DEFAULT_SOURCE)}).")


def _fsdp_keys(layers: tuple[Mapping[str, Setting], ...]) -> list[str]:
    return [FSDP_PREFIX + option for option in FSDPOptions.field_names()
            if any(FSDP_PREFIX + option in layer for layer in layers)]


def _fsdp_options(values: dict[str, Any], provenance: dict[str, str], offered: list[FSDPOptions]) -> FSDPOptions | None:
    """One FSDPOptions from the winning option values (None when FSDP is off).

    Values were parsed where they entered, by ``config.fsdp``'s one parser per option. When one layer's own
    options object (``offered``: the launcher's, a plugin's, TrainingArguments')
    already holds exactly the winning values, that object is the result: nothing is built twice."""
    chosen = {key[len(FSDP_PREFIX):]: value for key, value in values.items() if key.startswith(FSDP_PREFIX)}
    if not values.get("fsdp"):
        for key in [k for k in provenance if k.startswith(FSDP_PREFIX)]:
            del provenance[key]
        return None
    for option in FSDPOptions.field_names():
        provenance.setdefault(FSDP_PREFIX + option, DEFAULT_SOURCE)
    winners = {option: chosen.get(option, FSDPOptions.default_of(option)) for option in FSDPOptions.field_names()}
    for options in offered:
        if all(getattr(options, option) == value for option, value in winners.items()):
            return options
    sources = sorted({provenance[FSDP_PREFIX + option] for option in chosen})
    options = FSDPOptions()
    for option, value in chosen.items():
        setattr(options, option, value)
    # The options' own parsers (idempotent on values a layer already parsed; the check for callers of this
    # seam that hand over raw values).
    options.validate(f"FSDP options ({', '.join(sources) or DEFAULT_SOURCE})",
                     wheres={option: f"FSDP options ({provenance[FSDP_PREFIX + option]})" for option in chosen})
    return options


def _differs(key: str, explicit: Any, launched: Any) -> bool:
    parse = _PARSERS.get(key)
    try:
        if parse is not None:
            return parse(explicit, "explicit") != parse(launched, "launcher")
    except ValueError:
        return True
    return explicit != launched
