"""Seeding every random number generator a training run draws from, and making processes agree on one."""

from __future__ import annotations

import base64
import os
import random

import numpy as np
import torch

from trainkit.utils.enums import RNGType


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device).

    device_specific: add the process index to the seed, so ranks draw different numbers
        (e.g. for dropout) while staying reproducible.
    deterministic: also ask torch for deterministic algorithms.
    """
    if device_specific:
        seed += int(os.environ.get("RANK", 0))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds CUDA devices too
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _rng_state(rng_type: RNGType, generator: torch.Generator | None) -> torch.Tensor:
    if rng_type is RNGType.TORCH:
        return torch.get_rng_state()
    if rng_type is RNGType.CUDA:
        if not torch.cuda.is_available():
            raise RuntimeError("synchronize_rng_state('cuda'): CUDA is not available on this machine.")
        return torch.cuda.get_rng_state()
    if rng_type is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator to synchronise (generator=...).")
        return generator.get_state()
    raise NotImplementedError(f"synchronize_rng_state({rng_type.value!r}): trainkit does not drive "
                              f"{rng_type.value.upper()} devices; valid here: 'torch', 'cuda', 'generator'.")


def _set_rng_state(rng_type: RNGType, state: torch.Tensor, generator: torch.Generator | None) -> None:
    if rng_type is RNGType.TORCH:
        torch.set_rng_state(state)
    elif rng_type is RNGType.CUDA:
        torch.cuda.set_rng_state(state)
    else:
        assert generator is not None
        generator.set_state(state)


def synchronize_rng_state(rng_type: RNGType | None = None, generator: torch.Generator | None = None) -> None:
    """Give every process the main process's state of one random generator (``rng_type``: torch, cuda or
    generator, the last one being ``generator``). Nothing to do on a single process."""
    import torch.distributed as dist

    if rng_type is None:
        raise ValueError(f"synchronize_rng_state needs an rng_type: one of {RNGType.list()}.")
    rng_type = RNGType(rng_type)
    state = _rng_state(rng_type, generator)
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    # The state is a CPU byte tensor; NCCL needs it on the process's GPU for the broadcast.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    shared = state.to(device)
    dist.broadcast(shared, src=0)
    _set_rng_state(rng_type, shared.cpu(), generator)


def synchronize_rng_states(rng_types: list[str | RNGType], generator: torch.Generator | None = None) -> None:
    """:func:`synchronize_rng_state` for each of ``rng_types`` (e.g. ``["torch", "generator"]``)."""
    for rng_type in rng_types:
        synchronize_rng_state(RNGType(rng_type), generator=generator)


def rng_state_to_text(state: torch.Tensor) -> str:
    """A random generator's state (a uint8 tensor) as JSON-friendly base64 text (checkpoints are pickle-free)."""
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def rng_state_from_text(text: str) -> torch.Tensor:
    """The generator state :func:`rng_state_to_text` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
