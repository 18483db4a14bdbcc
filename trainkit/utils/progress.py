"""``tqdm`` that shows on the main process only (``accelerate.utils.tqdm``)."""

from __future__ import annotations

import os
from typing import Any


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """A ``tqdm.auto.tqdm`` bar, disabled on every process but the main one unless ``main_process_only=False``."""
    from tqdm.auto import tqdm as auto_tqdm

    if args and isinstance(args[0], bool):
        raise ValueError("tqdm: pass main_process_only as a keyword (main_process_only=True), not first.")
    if main_process_only:
        kwargs["disable"] = kwargs.get("disable", False) or int(os.environ.get("RANK", 0)) != 0
    return auto_tqdm(*args, **kwargs)
