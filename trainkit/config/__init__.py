"""Configuration as plain data: the launch config (Accelerate's YAML keys), FSDP options, their loaders, and
the engine's configuration resolved once from explicit arguments, the launcher's config and defaults.

Imports nothing heavy (no torch, no transformers) and nothing from the rest of trainkit, so the CLI can
validate a file in milliseconds and the engine can read the launcher's hand-off cheaply.
"""

from .engine import EngineConfig, Setting, resolve_engine_config
from .errors import ConfigError, check_choice, did_you_mean, invalid_value_error, unknown_key_error
from .files import (
    CONFIG_FILE_ENV,
    accelerate_default_config_path,
    default_config_path,
    load_fsdp_config,
    read_mapping_file,
    write_config_file,
)
from .fsdp import FSDPOptions
from .handoff import LAUNCH_CONFIG_ENV, load_launch_config_from_env, read_launch_handoff, write_launch_handoff
from .launch import LaunchConfig
from .precision import MIXED_PRECISIONS
from .values import DISTRIBUTED_TYPES, RDZV_BACKENDS

__all__ = [
    "CONFIG_FILE_ENV",
    "DISTRIBUTED_TYPES",
    "LAUNCH_CONFIG_ENV",
    "MIXED_PRECISIONS",
    "RDZV_BACKENDS",
    "Setting",
    "ConfigError",
    "EngineConfig",
    "FSDPOptions",
    "LaunchConfig",
    "accelerate_default_config_path",
    "check_choice",
    "default_config_path",
    "did_you_mean",
    "invalid_value_error",
    "load_fsdp_config",
    "load_launch_config_from_env",
    "read_launch_handoff",
    "read_mapping_file",
    "resolve_engine_config",
    "unknown_key_error",
    "write_config_file",
    "write_launch_handoff",
]
