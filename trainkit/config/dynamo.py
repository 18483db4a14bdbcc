"""torch.compile settings as plain data: Accelerate's ``TorchDynamoPlugin`` and its launch-config keys.

The same five settings arrive three ways: ``Accelerator(dynamo_backend=...)`` or
``Accelerator(dynamo_plugin=TorchDynamoPlugin(...))``, the ``dynamo_config:`` block of a launch YAML
(``dynamo_backend``, ``dynamo_mode``, ``dynamo_use_fullgraph``, ``dynamo_use_dynamic``,
``dynamo_use_regional_compilation``), and ``trainkit launch --dynamo_*`` flags. Backend names are
Accelerate's (upper case, ``NO`` = no compilation) or torch's (lower case); both are accepted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .options import Option, check_keys

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _flag_option(text: str) -> Option:
    return Option(help=text, default=False, parse=lambda value, key, where: _flag({key: value}, key, where))


DYNAMO_OPTIONS = {
    "dynamo_backend": Option(help="torch.compile backend for prepared models (inductor, aot_eager, ...; no = off).",
                             default="no", parse=lambda value, key, where: value or "no"),
    "dynamo_mode": Option(help=f"torch.compile mode: {', '.join(COMPILE_MODES)}.", default="default",
                          choices=COMPILE_MODES, parse=lambda value, key, where: None if value in (None, "default")
                          else value),
    "dynamo_use_fullgraph": _flag_option("true: fail on graph breaks instead of splitting the graph."),
    "dynamo_use_dynamic": _flag_option("true: compile for dynamic shapes."),
    "dynamo_use_regional_compilation": _flag_option("true: compile the repeated block once instead of the whole model."),
}
"""The launch YAML's ``dynamo_config:`` keys (and ``--<key>`` flags), declared once; the plugin validates the
values it builds from them (backend, mode)."""
DYNAMO_CONFIG_KEYS = tuple(DYNAMO_OPTIONS)


@dataclasses.dataclass
class TorchDynamoPlugin:
    """How prepared models are compiled with ``torch.compile`` (Accelerate's field names).

    Args:
        backend: a torch.compile backend ("inductor", "aot_eager", "eager", ...; Accelerate's upper-case
            names work too); "no" (what None, the default, becomes) compiles nothing.
        mode: torch.compile's mode ("default", "reduce-overhead", "max-autotune", ...).
        fullgraph: fail on graph breaks instead of splitting the graph (None: False).
        dynamic: compile for dynamic shapes (None lets torch decide after a shape changes).
        options: extra backend options passed to torch.compile.
        disable: turn compilation off without removing the rest of the settings.
        use_regional_compilation: compile each repeated block (a transformer layer) instead of the whole
            model: one compilation serves every copy of the block, so cold start is several times shorter
            (None: False).
    """

    # backend, fullgraph and use_regional_compilation default to None as in Accelerate; __post_init__ turns
    # None into "no" / False, so after construction they always hold a value.
    backend: str = None  # type: ignore[assignment]  # Accelerate's default; __post_init__ sets a backend name
    mode: str | None = None
    fullgraph: bool = None  # type: ignore[assignment]  # Accelerate's default; __post_init__ makes it a bool
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool = None  # type: ignore[assignment]  # Accelerate's default; __post_init__ makes it a bool

    def __post_init__(self) -> None:
        # Fields left unset read Accelerate's ACCELERATE_DYNAMO_* variables (what `accelerate launch` exports).
        env = {key: os.environ.get(f"ACCELERATE_DYNAMO_{key}") for key in _ENV_FIELDS}
        self.backend = normalise_backend(self.backend if self.backend is not None else env["BACKEND"] or "no")
        if self.mode is None and env["MODE"] not in (None, "default"):
            self.mode = env["MODE"]
        self.fullgraph = bool(self.fullgraph) if self.fullgraph is not None else _env_flag(env["USE_FULLGRAPH"])
        if self.dynamic is None and env["USE_DYNAMIC"] is not None:
            self.dynamic = _env_flag(env["USE_DYNAMIC"])
        self.use_regional_compilation = (bool(self.use_regional_compilation) if self.use_regional_compilation
                                         is not None else _env_flag(env["USE_REGIONAL_COMPILATION"]))
        if self.mode is not None and self.mode not in COMPILE_MODES:
            from .errors import invalid_value_error

            raise invalid_value_error("dynamo_mode", self.mode, COMPILE_MODES, where="TorchDynamoPlugin")

    @property
    def enabled(self) -> bool:
        """True when prepared models are compiled."""
        return self.backend != "no" and not self.disable

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile`` / ``nn.Module.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        if self.mode is not None and self.mode != "default":
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (Accelerate's ``KwargsHandler.to_dict``)."""
        return dataclasses.asdict(self)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from a plugin built with no arguments and no ACCELERATE_DYNAMO_*
        variables (Accelerate's ``KwargsHandler.to_kwargs``; ``use_regional_compilation`` is left out, as there)."""
        saved = {key: os.environ.pop(f"ACCELERATE_DYNAMO_{key}") for key in _ENV_FIELDS
                 if f"ACCELERATE_DYNAMO_{key}" in os.environ}
        try:
            default = type(self)().to_dict()
        finally:
            os.environ.update({f"ACCELERATE_DYNAMO_{key}": value for key, value in saved.items()})
        changed = {key: value for key, value in self.to_dict().items() if default[key] != value}
        changed.pop("use_regional_compilation", None)
        return changed

    def to_config(self) -> dict[str, Any]:
        """The ``dynamo_config`` block of a launch YAML that describes this plugin."""
        return {"dynamo_backend": self.backend.upper(), "dynamo_mode": self.mode or "default",
                "dynamo_use_fullgraph": self.fullgraph, "dynamo_use_dynamic": bool(self.dynamic),
                "dynamo_use_regional_compilation": self.use_regional_compilation}

    @classmethod
    def from_config(cls, block: Mapping[str, Any], *, where: str) -> TorchDynamoPlugin:
        """Read a launch YAML's ``dynamo_config`` block (unknown keys are refused by name)."""
        check_keys(block, DYNAMO_OPTIONS, where=where)
        values = {key: option.read(block.get(key, option.default), key, where) for key, option in DYNAMO_OPTIONS.items()}
        return cls(backend=values["dynamo_backend"], mode=values["dynamo_mode"],
                   fullgraph=values["dynamo_use_fullgraph"], dynamic=values["dynamo_use_dynamic"] or None,
                   use_regional_compilation=values["dynamo_use_regional_compilation"])


def normalise_backend(name: Any) -> str:
    """Accelerate's ``DynamoBackend`` names (``INDUCTOR``, ``NO``) and torch's (``inductor``) to torch's."""
    text = str(getattr(name, "value", name) if name is not None else "no").strip()
    if not text or text.upper() == "NO":
        return "no"
    return text.lower()


_ENV_FIELDS = ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC", "USE_REGIONAL_COMPILATION")


def _env_flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "yes", "1", "on", "y", "t")


def _flag(block: Mapping[str, Any], key: str, where: str) -> bool:
    value = block.get(key, False)
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0", ""):
        return False
    raise ConfigError(f"{key} ({where}) must be true or false, got {value!r}.")
