"""Options declared once: each setting's default, help, allowed values, parser and the names it is read under.

A section of the configuration (the launch keys, mixed precision, FSDP, parallelism, torch.compile, DeepSpeed,
checkpointing, preemption) is a dataclass whose fields are declared with :meth:`Option.field`, or, for a block
of an Accelerate YAML whose keys are not a class's fields, a table of :class:`Option`. Everything else reads
those declarations: the YAML reader parses each key with its option's parser, the launcher's flags (their type
and help) and environment variables, ``trainkit config``'s choices, and the engine's resolver, which parses the
settings it shares with the launcher with the same :class:`Option` objects. Adding a key is one declaration.

No torch here (the CLI validates a file with these parsers before any worker starts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .errors import check_choice, unknown_key_error
from .values import to_bool, to_int, to_positive_float

Parser = Callable[[Any, str, str], Any]
"""``(value, key as named in errors, where it came from) -> canonical value``; raises ``ConfigError``."""

OPTION = "trainkit.option"
"""The dataclass field metadata key that holds a field's :class:`Option`."""


@dataclasses.dataclass(frozen=True)
class Keyword:
    """A name a Python surface gives an option: an ``Accelerator(...)`` keyword or a ``TrainingArguments`` field.

    The surfaces loop over the declarations (``engine/accelerator_parts/configuration.py``,
    ``trainer/training_arguments/engine_settings.py``): a keyword given a value other than "not set" is an
    explicit setting of its option, with the provenance ``"<owner>(<shown>)"``.
    """

    name: str
    """The keyword or field name (``cpu``, ``bf16``, ``ddp_timeout``)."""
    shown: str = ""
    """How provenance writes it between the parentheses; empty: ``"<name>="``."""
    owner: str = ""
    """The object provenance names when it is not the surface itself (``InitProcessGroupKwargs`` for ``timeout``)."""
    unset: tuple[Any, ...] = ()
    """Values that also mean "not set", besides the surface's own rule (an ``Accelerator`` keyword left at None,
    a ``TrainingArguments`` field at transformers' default): ``gradient_accumulation_steps=1``, Accelerate's
    default, which scripts pass through from their own argparse defaults."""
    convert: Callable[[Any], Any] | None = None
    """The given value as the option's value (a ``timedelta`` in seconds, ``bf16=True`` as ``"bf16"``); None: as given."""

    def is_unset(self, value: Any, default: Any = None) -> bool:
        """Whether ``value`` asks for nothing (``default``: the surface's own "not given")."""
        return value is None or value == default or any(value == other for other in self.unset)

    def setting(self, value: Any, surface: str) -> tuple[Any, str]:
        """``(option value, provenance)`` for ``value`` given to this keyword of ``surface``."""
        shown = self.shown or f"{self.name}="
        return (self.convert(value) if self.convert else value), f"{self.owner or surface}({shown})"


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting, declared once: the single source of its default, help, choices, parser and other names."""

    help: str
    """One line: shown for the launcher's flag, ``trainkit config --show`` and the docs."""
    default: Any = None
    """The value when no layer sets it (a field declared with :meth:`field` takes it as its default)."""
    choices: tuple[str, ...] = ()
    """The allowed values (canonical spellings; any case is accepted); empty: not a fixed set."""
    parse: Parser | None = None
    """The one parser; None: a choice among :attr:`choices`, or the value as given."""
    flag: bool = True
    """Whether the launcher has a ``--<key>`` flag for it (its name is the key)."""
    flag_type: Callable[[str], Any] = str
    """How argparse reads the flag's text (``int`` fails at the command line; ``str`` leaves it to :attr:`parse`)."""
    env: tuple[str, ...] = ()
    """Environment variables that set it where no flag does (torchrun's ``PET_*``), lowest first."""
    accelerator: Keyword | None = None
    """The ``Accelerator(...)`` keyword that sets it explicitly (None: no keyword does)."""
    training_arguments: tuple[Keyword, ...] = ()
    """The ``TrainingArguments`` fields that set it (a field at transformers' default is not set)."""

    def read(self, value: Any, key: str, where: str) -> Any:
        """``value`` in its canonical form, or a ``ConfigError`` naming ``key``, ``where`` and what is valid."""
        if self.parse is not None:
            return self.parse(value, key, where)
        if self.choices:
            return check_choice(key, value, self.choices, where=where)
        return value

    def field(self, **kwargs: Any) -> Any:
        """A dataclass field declared by this option (its default; the option kept in the field's metadata)."""
        return dataclasses.field(default=self.default, metadata={OPTION: self}, **kwargs)


def declared_options(cls: Any) -> dict[str, Option]:
    """The fields of dataclass ``cls`` declared with :meth:`Option.field`, in declaration order."""
    return {field.name: field.metadata[OPTION] for field in dataclasses.fields(cls) if OPTION in field.metadata}


def parse_declared(instance: Any, where_of: Callable[[str], str]) -> None:
    """Parse every declared field of ``instance`` in place, each with its own option (``where_of(name)``: its source)."""
    for name, option in declared_options(type(instance)).items():
        setattr(instance, name, option.read(getattr(instance, name), name, where_of(name)))


def flag_options(cls: Any) -> dict[str, Option]:
    """The declared fields of ``cls`` that the launcher takes as a plain ``--<name>`` flag."""
    return {name: option for name, option in declared_options(cls).items() if option.flag}


def env_options(cls: Any) -> dict[str, str]:
    """Environment variable -> the field of ``cls`` it sets, for every declared variable."""
    return {variable: name for name, option in declared_options(cls).items() for variable in option.env}


def check_keys(mapping: Mapping[str, Any], table: Mapping[str, Option], *, where: str) -> None:
    """Refuse a key of ``mapping`` that ``table`` does not declare (with a did-you-mean)."""
    for key in mapping:
        if key not in table:
            raise unknown_key_error(key, table, where=where)


# -- the parsers most options share ------------------------------------------------------------------
def boolean(value: Any, key: str, where: str) -> bool:
    """A boolean in any of the config spellings (``config.values.BOOLEAN_SPELLINGS``)."""
    return to_bool(key, value, where)


def integer(minimum: int) -> Parser:
    """An integer at least ``minimum``."""
    return lambda value, key, where: to_int(key, value, where, minimum=minimum)


def seconds(value: Any, key: str, where: str) -> float:
    """A number of seconds above 0."""
    return to_positive_float(key, value, where)


def optional(parse: Parser) -> Parser:
    """``parse``, with None kept as None ("not set")."""
    return lambda value, key, where: None if value is None else parse(value, key, where)
