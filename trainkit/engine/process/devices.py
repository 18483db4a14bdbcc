"""Which device a process computes on, and the check that every process on a machine gets its own GPU.

Two processes on one GPU is never what a user wants: NCCL refuses it ("Duplicate GPU detected") deep
inside the first collective, and gloo would silently share the card. The check runs twice with the same
words: in ``trainkit launch`` before any worker starts, and in each worker under a plain ``torchrun``.
"""

from __future__ import annotations

import torch

from trainkit.config.errors import ConfigError

DEVICE_TYPES = ("cpu", "cuda")
"""The device types the engine computes on (``Accelerator(cpu=True)`` / ``use_cpu=True`` pick the first).
The Trainer reads this list too, so the two cannot disagree about where a setting can run."""


def check_processes_fit_gpus(processes_per_machine: int, gpu_count: int, *, where: str) -> None:
    """Raise when a machine runs more processes than it has (visible) GPUs; say how to get out of it."""
    if gpu_count <= 0 or processes_per_machine <= gpu_count:
        return
    raise ConfigError(
        f"{where}: {processes_per_machine} processes per machine but only {gpu_count} GPU"
        f"{'s' if gpu_count != 1 else ''} visible; each process needs a GPU of its own. Use "
        f"--num_processes {gpu_count} (one per GPU), --cpu to run every process on CPU with gloo, or "
        "--gpu_ids to choose which GPUs this machine uses (and as many processes)."
    )


def choose_device(local_rank: int, local_world_size: int, *, cpu: bool) -> torch.device:
    """This process's device: the CPU when asked or when there is no GPU, else GPU ``local_rank``.

    The GPU becomes the process's current CUDA device, so kernels and NCCL use it without being told.
    """
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    check_processes_fit_gpus(local_world_size, torch.cuda.device_count(),
                             where="Accelerator() under a launcher")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
