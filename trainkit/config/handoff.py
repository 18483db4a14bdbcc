"""The launcher-to-worker hand-off: one JSON file holding the resolved config, named by one env variable.

``trainkit launch`` calls :func:`write_launch_handoff` and sets ``TRAINKIT_LAUNCH_CONFIG`` for its workers;
in a worker, the engine configuration's resolver (:mod:`trainkit.config.engine`) is the one reader: it calls
:func:`load_launch_config_from_env` (cached per process and per file). The engine never reads it otherwise.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from .errors import ConfigError
from .files import write_text_atomic
from .launch import LaunchConfig

LAUNCH_CONFIG_ENV = "TRAINKIT_LAUNCH_CONFIG"
_FORMAT = "trainkit-launch-config/1"


def write_launch_handoff(config: LaunchConfig, path: str | os.PathLike[str]) -> Path:
    """Write ``config`` (every key, with provenance) to ``path`` for the workers to read."""
    payload = {"format": _FORMAT, "config": config.to_dict(full=True), "provenance": config.provenance}
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_launch_handoff(path: str | os.PathLike[str]) -> LaunchConfig:
    """Read a file written by :func:`write_launch_handoff` (provenance restored)."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"Cannot read the launcher's config {os.fspath(path)!r} (${LAUNCH_CONFIG_ENV}): {error}") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ConfigError(f"{os.fspath(path)!r} (${LAUNCH_CONFIG_ENV}) is not a trainkit launch hand-off file.")
    # The launcher already decided distributed_type (it knows whether CUDA exists); keep its answer.
    config = LaunchConfig.from_mapping(payload["config"], source="launcher")
    config.provenance.update(payload.get("provenance") or {})
    return config


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> LaunchConfig:
    return read_launch_handoff(path)


def load_launch_config_from_env() -> LaunchConfig | None:
    """The config ``trainkit launch`` resolved for this worker, or None when not started by it.

    Cached per process (per file path): call it as often as convenient. Treat the result as read-only.
    """
    path = os.environ.get(LAUNCH_CONFIG_ENV)
    if not path:
        return None
    return _load_cached(path)
