"""The mixed-precision section, declared once: the modes, their compute dtypes, their engine classes, their options.

Every surface reads this module: the launcher's ``--mixed_precision`` flag and YAML key, ``trainkit config``'s
question, ``Accelerator(mixed_precision=)``, ``TrainingArguments(fp16=/bf16=)`` (through the resolver), the FSDP
plugin's ``mixed_precision_policy`` strings and the engine's precision registry
(``trainkit.engine.precision.registry``), which builds :attr:`PrecisionDeclaration.target`.

A precision with settings of its own (an fp8 recipe's format and history length, say) declares an options
dataclass (fields declared with :class:`~trainkit.config.options.Option`) and the YAML block that holds them
(Accelerate's ``fp8_config:``); the launcher then takes the block and its ``--<prefix><key>`` flags, the
resolver keeps the values with their provenance, ``Accelerator(kwargs_handlers=[<options>(...)])`` sets them
explicitly, and the precision class receives the parsed object as ``options``. A new precision is one
declaration here plus one class in ``engine/precision/``. No torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, check_choice
from .options import Keyword, Option, check_keys, declared_options


@dataclasses.dataclass(frozen=True)
class PrecisionDeclaration:
    """One mixed-precision mode: what implements it, its compute dtype, where it runs and its own options."""

    target: str
    """The engine class, ``"module:Class"`` (a ``trainkit.engine.precision.base.Precision`` subclass, imported
    when first built)."""
    dtype: str | None = None
    """torch's name of the low-precision compute dtype (``"bfloat16"``); None: full precision."""
    runs_on: tuple[str, ...] | None = None
    """Device types it runs on; None: every device type the engine computes on."""
    options: type | None = None
    """The dataclass of this mode's own settings (fields declared with ``Option.field``); None: it has none."""
    block: str | None = None
    """The launch YAML block holding those settings (e.g. Accelerate's ``fp8_config``); its flags are
    ``--<flag_prefix><field>``."""
    flag_prefix: str = ""

    def read_options(self, values: Mapping[str, Any] | Any, *, where: str) -> Any:
        """This mode's options from a mapping of field names (or the options object itself), each parsed by its
        declaration; unknown keys are refused by name."""
        if self.options is None:
            raise ConfigError(f"{where}: this mixed precision takes no options.")
        if isinstance(values, self.options):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {self.options.__name__} fields, got {values!r}.")
        table = declared_options(self.options)
        bare = {_strip(key, self.flag_prefix): value for key, value in values.items()}
        check_keys(bare, table, where=where)
        return self.options(**{key: table[key].read(value, key, where) for key, value in bare.items()})


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix):] if prefix and key.startswith(prefix) else key


PRECISIONS: dict[str, PrecisionDeclaration] = {
    "no": PrecisionDeclaration("trainkit.engine.precision.base:Precision"),
    # fp16 on CPU autocasts to float16 and scales the loss with a CPU GradScaler.
    "fp16": PrecisionDeclaration("trainkit.engine.precision.amp:AutocastPrecision", dtype="float16"),
    "bf16": PrecisionDeclaration("trainkit.engine.precision.amp:AutocastPrecision", dtype="bfloat16"),
}
"""Every mixed-precision mode, by the name the launcher, ``Accelerator`` and the YAML use."""

MIXED_PRECISIONS: tuple[str, ...] = tuple(PRECISIONS)
"""The modes' names: the one vocabulary of mixed precision."""

ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp32": "no", "float32": "no"}
"""torch's dtype names for the same modes (FSDP's ``mixed_precision_policy`` strings use them)."""

NOT_SUPPORTED = {"fp8": "use bf16 or fp16"}
"""Accelerate's modes trainkit does not run, with the advice its error gives."""


def parse_mixed_precision(value: Any, where: str, key: str = "mixed_precision") -> str:
    """A mode of :data:`PRECISIONS` (null/false mean no; torch's dtype names are accepted); Accelerate's modes
    trainkit lacks get a "not supported" error."""
    if value is None or value is False:
        return "no"
    text = str(value).strip()
    if text.lower() in NOT_SUPPORTED and text.lower() not in PRECISIONS:
        raise ConfigError(f"{key} {text.lower()!r} ({where}) is not supported by trainkit; "
                          f"{NOT_SUPPORTED[text.lower()]}.")
    text = ALIASES.get(text.lower(), text)
    return check_choice(key, text, tuple(PRECISIONS), where=where)  # read now: a test may declare a mode


MIXED_PRECISION = Option(
    help=f"Mixed precision: {', '.join(MIXED_PRECISIONS)}.", default="no", choices=MIXED_PRECISIONS,
    parse=lambda value, key, where: parse_mixed_precision(value, where, key),
    accelerator=Keyword("mixed_precision"),
    training_arguments=(Keyword("fp16", shown="fp16=True", convert=lambda _: "fp16"),
                        Keyword("bf16", shown="bf16=True", convert=lambda _: "bf16")))
"""The ``mixed_precision`` setting, shared by the launch config and the engine's config."""


def option_blocks() -> dict[str, tuple[str, PrecisionDeclaration]]:
    """YAML block name -> (mode, declaration) for every mode that declares options."""
    return {declaration.block: (mode, declaration) for mode, declaration in PRECISIONS.items()
            if declaration.options is not None and declaration.block}


def declaration_for_options(options: Any) -> tuple[str, PrecisionDeclaration] | None:
    """The (mode, declaration) whose options class ``options`` is an instance of, or None."""
    for mode, declaration in PRECISIONS.items():
        if declaration.options is not None and isinstance(options, declaration.options):
            return mode, declaration
    return None
