"""TrainingArguments against the installed transformers: which fields differ, and what needs which release.

trainkit's ``TrainingArguments`` carries the fields of the newest transformers it knows
(:data:`NEWEST_KNOWN_TRANSFORMERS`) and accepts them whatever transformers is installed. Users install trainkit
next to an older or newer transformers, so the fields can drift both ways:

- a field of an *older* transformers' list that trainkit also knows: nothing to do;
- a field trainkit has that the installed transformers lacks (``activation_checkpointing`` before 5.23): accepted,
  and acting through what the installed release has (see :func:`check_version_dependent_fields`);
- a field the installed transformers has that trainkit does not (a release newer than trainkit knows): refused
  when used, naming the field and the release (:func:`unknown_field_hint`), and listed by :func:`field_drift`;
- a default that differs: trainkit's *effective* default (the value after construction) follows the installed
  transformers; a declared ``None`` means "not set" where trainkit needs to tell (``gradient_checkpointing``).

The installed ``transformers.TrainingArguments`` dataclass is the oracle throughout: nothing here lists its fields.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

from trainkit.config.errors import ConfigError

NEWEST_KNOWN_TRANSFORMERS = "5.24.0"
"""The newest transformers release whose TrainingArguments fields, defaults and meanings trainkit carries."""
CHECKPOINTING_LAYER_OPTIONS_SINCE = "5.16.0"
"""First transformers whose models' ``gradient_checkpointing_enable`` take ``every_n_layers`` and ``offload``."""
CHECKPOINTING_LAYER_OPTIONS = {"every_n_layers": 1, "offload": False}
"""The ``activation_checkpointing_kwargs`` keys that belong to the model's method (with their neutral values), not to
``torch.utils.checkpoint``."""

WHERE = "TrainingArguments"


@functools.lru_cache(maxsize=1)
def installed_transformers_version() -> str:
    """The installed transformers' version string, read from its package metadata: ``import transformers`` alone
    costs ~0.3 s (it scans its model folders), which a run of a plain ``nn.Module`` need not pay."""
    from importlib.metadata import version

    return version("transformers")


def installed_transformers_release() -> tuple[int, int]:
    """The installed transformers' (major, minor), for behaviour that changed between releases."""
    from packaging.version import Version

    release = Version(installed_transformers_version()).release
    return release[0], release[1] if len(release) > 1 else 0


def is_newer_than_known(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed transformers) is newer than :data:`NEWEST_KNOWN_TRANSFORMERS`."""
    from packaging.version import Version  # a transformers dependency

    return Version(version or installed_transformers_version()) > Version(NEWEST_KNOWN_TRANSFORMERS)


@functools.lru_cache(maxsize=1)
def installed_field_defaults() -> dict[str, Any]:
    """Every field of the installed ``transformers.TrainingArguments`` with its declared default."""
    from transformers import TrainingArguments as TransformersArguments

    return {f.name: declared_default(f) for f in dataclasses.fields(TransformersArguments)}


def declared_default(dataclass_field: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory called), as a plain value (enum members by their value)."""
    if dataclass_field.default_factory is not dataclasses.MISSING:
        value = dataclass_field.default_factory()
    else:
        value = dataclass_field.default
    return getattr(value, "value", value)


@dataclass
class FieldDrift:
    """How trainkit's TrainingArguments differ from a transformers release's (see the module doc)."""

    transformers_version: str
    unknown: dict[str, Any] = field(default_factory=dict)
    """Fields that release has and trainkit lacks, with that release's defaults."""
    not_in_transformers: list[str] = field(default_factory=list)
    """Fields trainkit has (from a newer release) that this release lacks: accepted all the same."""
    defaults: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Fields whose effective default differs: name -> (trainkit's, the release's)."""

    @property
    def newer_than_known(self) -> bool:
        """The release is newer than the newest trainkit knows: differences are expected, not defects."""
        return is_newer_than_known(self.transformers_version)

    @property
    def is_complete(self) -> bool:
        """trainkit has every field of the release, with its default."""
        return not self.unknown and not self.defaults

    def report(self) -> str:
        """Every difference, one per line, saying what to do about it."""
        lines = [f"TrainingArguments against transformers {self.transformers_version} (trainkit knows the fields "
                 f"of transformers up to {NEWEST_KNOWN_TRANSFORMERS}):"]
        for name, default in sorted(self.unknown.items()):
            lines.append(f"  missing in trainkit: {name} (default {default!r}): add it, or refuse it by name")
        for name, (ours, theirs) in sorted(self.defaults.items()):
            lines.append(f"  default of {name}: trainkit {ours!r}, transformers {theirs!r}")
        for name in sorted(self.not_in_transformers):
            lines.append(f"  not in this transformers (accepted by trainkit): {name}")
        if len(lines) == 1:
            lines.append("  no difference")
        return "\n".join(lines)


def field_drift(ours: type, theirs: type | None = None, version: str | None = None) -> FieldDrift:
    """Compare trainkit's TrainingArguments class ``ours`` with a transformers TrainingArguments class (default: the
    installed one). A default counts as different only when trainkit's value after construction differs, so a
    declared ``None`` that means "not set" and resolves to the release's default is not a difference."""
    if theirs is None:
        theirs_defaults = installed_field_defaults()
    else:
        theirs_defaults = {f.name: declared_default(f) for f in dataclasses.fields(theirs)}
    version = version or installed_transformers_version()
    our_fields = {f.name: f for f in dataclasses.fields(ours)}
    drift = FieldDrift(version)
    drift.unknown = {name: default for name, default in theirs_defaults.items() if name not in our_fields}
    drift.not_in_transformers = sorted(set(our_fields) - set(theirs_defaults))
    constructed = None
    for name, theirs_default in theirs_defaults.items():
        if name not in our_fields:
            continue
        our_default = declared_default(our_fields[name])
        if our_default == theirs_default:
            continue
        if constructed is None:
            constructed = ours()
        effective = getattr(getattr(constructed, name), "value", getattr(constructed, name))
        if effective != theirs_default:
            drift.defaults[name] = (our_default, theirs_default)
    return drift


def unknown_field_hint(name: str) -> str | None:
    """For a keyword trainkit does not define: the sentence to add when the installed transformers has that field
    (trainkit is older than that transformers), else None."""
    if name not in installed_field_defaults():
        return None
    return (f" It is a field of the installed transformers {installed_transformers_version()}, newer than the "
            f"transformers {NEWEST_KNOWN_TRANSFORMERS} whose fields this trainkit carries: trainkit does not implement "
            "it yet. Remove it, or use a trainkit release that supports it.")


def model_checkpointing_options() -> set[str]:
    """The per-model options (``every_n_layers``, ``offload``) the installed transformers' models take."""
    from transformers import PreTrainedModel

    method = getattr(PreTrainedModel, "activation_checkpointing_enable", None) or PreTrainedModel.gradient_checkpointing_enable
    return set(inspect.signature(method).parameters) & set(CHECKPOINTING_LAYER_OPTIONS)


def requested_layer_options(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The ``every_n_layers`` / ``offload`` entries of ``activation_checkpointing_kwargs`` set to a non-neutral value."""
    return {key: value for key, value in (kwargs or {}).items()
            if key in CHECKPOINTING_LAYER_OPTIONS and value != CHECKPOINTING_LAYER_OPTIONS[key]}


def check_version_dependent_fields(args: Any) -> None:
    """Refuse, at construction, a field value whose meaning needs a newer transformers than the installed one.

    ``activation_checkpointing`` itself works on every release (through ``gradient_checkpointing_enable`` where the
    model has no ``activation_checkpointing_enable``); its per-layer options need the release that added them.
    """
    if not args.activation_checkpointing:
        return
    wanted = requested_layer_options(args.activation_checkpointing_kwargs)
    lacking = sorted(set(wanted) - model_checkpointing_options())
    if lacking:
        raise ConfigError(
            f"activation_checkpointing_kwargs {', '.join(f'{k}={wanted[k]!r}' for k in lacking)} in {WHERE} needs "
            f"transformers >= {CHECKPOINTING_LAYER_OPTIONS_SINCE}, whose models take them; the installed transformers "
            f"{installed_transformers_version()} checkpoints every layer on the device only. Upgrade transformers, or "
            "leave them out.")
