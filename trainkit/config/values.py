"""Parsing single config values: booleans, integers, seconds and the named choices of the launch config.

Each parser names the key, where it came from and the valid choices when it refuses a value.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError, check_choice, invalid_value_error

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED")
# Accelerate's other distributed types: recognised so the error says "not supported" instead of "typo".
UNSUPPORTED_DISTRIBUTED_TYPES = (
    "MEGATRON_LM", "XLA", "TPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_SDAA",
    "MULTI_MUSA", "MULTI_HPU",
)
RDZV_BACKENDS = ("static", "c10d")
COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE",)


def parse_distributed_type(value: Any, where: str) -> str:
    """Canonical distributed_type; Accelerate's types trainkit lacks get a "not supported" error."""
    text = str(value).strip().upper() if value is not None else "NO"
    if text in UNSUPPORTED_DISTRIBUTED_TYPES:
        raise ConfigError(
            f"distributed_type {value!r} ({where}) is an Accelerate setting that trainkit does not support. "
            f"Supported: {', '.join(DISTRIBUTED_TYPES)} (DEEPSPEED configs run on FSDP2).")
    return check_choice("distributed_type", text, DISTRIBUTED_TYPES, where=where)


def parse_gpu_ids(value: Any) -> str | None:
    """"all", "0,1", [0, 1] or 0 -> a comma-separated string (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(str(int(v)) for v in value)
    return str(value).strip() or None


BOOLEAN_SPELLINGS = {**dict.fromkeys(("true", "yes", "y", "t", "on", "1"), True),
                     **dict.fromkeys(("false", "no", "n", "f", "off", "0"), False)}
"""Every text spelling of a boolean a config value may use: Accelerate's (its ``str_to_bool``, which its
launcher applies to every FSDP boolean) and YAML's, any case. The one vocabulary for every boolean key."""


def to_bool(key: str, value: Any, where: str) -> bool:
    """Accept YAML/flag spellings of a boolean (:data:`BOOLEAN_SPELLINGS`, or 1/0) or raise naming ``key``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in BOOLEAN_SPELLINGS:
        return BOOLEAN_SPELLINGS[value.strip().lower()]
    raise invalid_value_error(key, value, ("true", "false"), where=where)


def to_int(key: str, value: Any, where: str, *, minimum: int) -> int:
    """Parse an integer at least ``minimum`` or raise naming ``key``."""
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool):
        raise ConfigError(f"Invalid value {value!r} for {key!r} in {where}: expected an integer >= {minimum}.")
    if number < minimum:
        raise ConfigError(f"Invalid value {value!r} for {key!r} in {where}: must be >= {minimum}.")
    return number


def to_positive_float(key: str, value: Any, where: str) -> float:
    """Parse a number of seconds > 0 or raise naming ``key``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not number > 0:
        raise ConfigError(f"Invalid value {value!r} for {key!r} in {where}: expected a number of seconds > 0.")
    return number

