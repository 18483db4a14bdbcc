"""Which device a process computes on, and the check that every process on a machine gets its own GPU.

Two processes on one GPU is never what a user wants: NCCL refuses it ("Duplicate GPU detected") deep
inside the first collective, and gloo would silently share the card. The check runs twice with the same
words: in ``trainkit launch`` before any worker starts, and in each worker under a plain ``torchrun``.
"""

from __future__ import annotations

import os

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


def choose_device(local_rank: int, local_world_size: int, *, cpu: bool, assigned: str | None = None) -> torch.device:
    """This process's device: a CPU device the launcher named (``assigned``, from ``ACCELERATE_TORCH_DEVICE``, kept
    as written), else the CPU when asked or when there is no GPU, else the GPU the launcher assigned, else GPU
    ``local_rank``.

    Ray Train assigns each worker its GPU and names it in ``ACCELERATE_TORCH_DEVICE`` (Accelerate reads the
    same variable): its index among the visible GPUs need not be the local rank. The GPU becomes the
    process's current CUDA device, so kernels and NCCL use it without being told.
    """
    named = _named_device(assigned) if assigned is not None else None
    if named is not None and named.type == "cpu":
        return named  # as named, index included ("cpu:64"), as Accelerate's state.device: placement is the CPU's
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    if named is not None:
        index = 0 if named.index is None else named.index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"ACCELERATE_TORCH_DEVICE={assigned!r}: only {torch.cuda.device_count()} GPU(s) visible "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}).")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    check_processes_fit_gpus(local_world_size, torch.cuda.device_count(),
                             where="Accelerator() under a launcher")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _named_device(assigned: str) -> torch.device:
    try:
        device = torch.device(assigned)
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES:
        raise ConfigError(f"ACCELERATE_TORCH_DEVICE={assigned!r}: trainkit computes on {' or '.join(DEVICE_TYPES)} "
                          "(e.g. 'cuda:0' or 'cpu'); unset it to use GPU LOCAL_RANK.")
    return device
