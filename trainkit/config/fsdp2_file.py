"""Rewriting an Accelerate config file's FSDP1 ``fsdp_config`` into FSDP2's keys (``trainkit to-fsdp2``).

trainkit reads either form and always runs FSDP2 (docs/fsdp.md). The rewrite is for files that other tools read
too: Accelerate's FSDP2 plugin (``fsdp_version: 2``) refuses FSDP1-only keys, so a rewritten file works with
``accelerate launch`` and ``trainkit launch`` alike. The table below is the whole rule.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

RENAMED = {"fsdp_sharding_strategy": "fsdp_reshard_after_forward"}
"""FSDP1 key -> its FSDP2 key (the value is translated by :data:`RESHARD_AFTER_FORWARD`)."""
RESHARD_AFTER_FORWARD = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False,
                         "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}
"""An FSDP1 sharding strategy -> FSDP2's ``reshard_after_forward`` (parameters freed after forward or kept)."""
DROPPED = {
    "fsdp_backward_prefetch": "FSDP2 prefetches by its own schedule",
    "fsdp_use_orig_params": "FSDP2 always exposes the original parameters",
    "fsdp_sync_module_states": "FSDP2 loads rank 0's weights with fsdp_cpu_ram_efficient_loading",
    "fsdp_forward_prefetch": "Accelerate's FSDP2 plugin does not take it",
}
"""FSDP1-only keys that an FSDP2 file must not hold, each with why."""


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """Rewrite ``config["fsdp_config"]`` (in place, and return ``config``) to FSDP2's keys, ``fsdp_version: 2``.

    Keys the table does not name are kept as they are. A config without ``fsdp_config``, or already at
    ``fsdp_version: 2``, comes back unchanged (the latter with a warning: its keys are taken as FSDP2's).
    """
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("No fsdp_config in the config: nothing to convert.")
        return config
    if is_fsdp2(config):
        logger.warning("Config already specifies FSDP2, skipping conversion... (fsdp_version is 2; set it to 1 and "
                       "rerun if its keys are still FSDP1's)")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        if key in DROPPED:
            logger.warning("%s dropped: %s.", key, DROPPED[key])
        elif key in RENAMED or key == "fsdp_reshard_after_forward":
            converted[RENAMED.get(key, key)] = _reshard_after_forward(value)
        else:
            converted[key] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def _reshard_after_forward(value: Any) -> Any:
    """A strategy name becomes FSDP2's boolean; a boolean (already FSDP2's) or anything else stays."""
    return RESHARD_AFTER_FORWARD.get(value, value) if isinstance(value, str) else value


def is_fsdp2(config: Mapping[str, Any]) -> bool:
    """True when ``config``'s fsdp_config already says ``fsdp_version: 2``."""
    return str((config.get("fsdp_config") or {}).get("fsdp_version", 1)) == "2"
