"""Version comparisons (``accelerate.utils.versions``): ``compare_versions`` and ``is_torch_version``.

A script written for Accelerate may ask ``compare_versions("accelerate", ">=", "0.27.0")`` to decide whether to
use a feature. Under trainkit the script's Accelerate *is* trainkit, so the name ``"accelerate"`` is answered
with the Accelerate release whose API trainkit implements (``trainkit.__accelerate_version__``), whether or not
the ``accelerate`` package is also installed: a feature trainkit has is never skipped because of a version gate
(docs/migrating-from-accelerate.md, "Version gates").
"""

from __future__ import annotations

import importlib.metadata

from packaging.version import Version, parse

from trainkit.utils.constants import STR_OPERATION_TO_FUNC
from trainkit.version import __accelerate_version__


def library_version(name: str) -> Version:
    """The installed version of the distribution ``name``; ``"accelerate"`` is trainkit's Accelerate API level."""
    if name == "accelerate":
        return parse(__accelerate_version__)
    return parse(importlib.metadata.version(name))


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Compare a library's installed version (by distribution name) or a version with ``requirement_version``
    using ``operation`` (``">"``, ``">="``, ``"=="``, ``"!="``, ``"<="``, ``"<"``)."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"compare_versions: operation must be one of {list(STR_OPERATION_TO_FUNC)}, "
                         f"got {operation!r}")
    if isinstance(library_or_version, str):
        library_or_version = library_version(library_or_version)
    return bool(STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version with ``version`` using ``operation`` (">=", "<", "==", ...).

    The release number is compared (``2.13.0+cpu`` and a ``2.13.0a0`` nightly count as 2.13.0), so a feature
    gate for a torch release also holds on that release's CPU and nightly builds."""
    import torch

    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"is_torch_version: operation must be one of {sorted(STR_OPERATION_TO_FUNC)}, "
                         f"got {operation!r}.")
    comparison = STR_OPERATION_TO_FUNC[operation]
    return bool(comparison(Version(Version(torch.__version__).base_version), Version(version)))


__all__ = ["compare_versions", "is_torch_version", "library_version"]
