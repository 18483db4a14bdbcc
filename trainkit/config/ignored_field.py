"""A test mode for the field proofs: ``TRAINKIT_IGNORE_FIELD=<Class>.<name>`` makes trainkit use the default of
that one ``TrainingArguments`` field or ``Accelerator`` keyword instead of the value it was given.

``tests/ignore_each_field.py`` runs the proof of every field and keyword with it ignored this way and expects
each proof to fail: a proof that still passes does not show the effect of its field. The variable is read in
:func:`ignored_name` only; worker processes inherit it. It is a check of the tests, never a setting for runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from trainkit.config.errors import ConfigError, did_you_mean

logger = logging.getLogger(__name__)

ENV_VAR = "TRAINKIT_IGNORE_FIELD"
_ANNOUNCED: set[str] = set()
P = ParamSpec("P")
R = TypeVar("R")


def ignored_name(owners: Iterable[str], names: Iterable[str]) -> str | None:
    """The field of one of ``owners`` (class names) that ``TRAINKIT_IGNORE_FIELD`` names, or None.

    A name that none of ``names`` matches is an error, so a typo cannot make a proof look sound."""
    value = os.environ.get(ENV_VAR, "").strip()
    owner, _, name = value.partition(".")
    if not value or owner not in set(owners):
        return None
    known = list(names)
    if name not in known:
        guess = did_you_mean(name, known)
        raise ConfigError(f"{ENV_VAR}={value!r}: {owner} has no field or keyword {name!r}."
                          + (f" Did you mean {guess!r}?" if guess else ""))
    if value not in _ANNOUNCED:
        _ANNOUNCED.add(value)
        logger.warning("%s=%s: %s.%s is ignored (its default is used instead of the value given). This is the "
                       "test mode of the field proofs, not a setting.", ENV_VAR, value, owner, name)
    return name


def reset_ignored_field(obj: Any) -> None:
    """Set the dataclass field that ``TRAINKIT_IGNORE_FIELD`` names for ``obj``'s class back to its default
    (called first in ``__post_init__``, so everything derived from the field sees the default)."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    name = ignored_name((cls.__name__ for cls in type(obj).__mro__), fields)
    if name is None:
        return
    field = fields[name]
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    setattr(obj, name, default)


def honour_ignored_keyword(owner: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate ``owner.__init__``: a call passing the keyword that ``TRAINKIT_IGNORE_FIELD`` names runs as if it
    had not been passed (by position or by name)."""

    def decorate(init: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(init)

        @functools.wraps(init)
        def init_without_ignored(*args: P.args, **kwargs: P.kwargs) -> R:
            name = ignored_name((owner,), (p for p in signature.parameters if p != "self"))
            if name is None:
                return init(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.arguments.pop(name, None)
            return init(*bound.args, **bound.kwargs)

        return init_without_ignored

    return decorate


__all__ = ["ENV_VAR", "honour_ignored_keyword", "ignored_name", "reset_ignored_field"]
