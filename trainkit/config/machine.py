"""What this machine has, guessed without importing torch (the launcher and ``trainkit config`` stay fast).

Used only where no better answer is at hand: ``trainkit launch`` asks torch itself before starting
several workers, and the engine decides the device from torch in each worker.
"""

from __future__ import annotations

import os


def gpus_probably_present() -> bool:
    """True when a GPU driver lists devices here (NVIDIA's /proc entry, or AMD's /dev/kfd) and
    ``CUDA_VISIBLE_DEVICES`` does not hide them all."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        if os.listdir("/proc/driver/nvidia/gpus"):
            return True
    except OSError:
        pass
    return os.path.exists("/dev/kfd")
