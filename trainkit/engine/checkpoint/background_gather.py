"""Full-state checkpoints of sharded models, gathered by the background writer instead of the training loop.

A ``FULL_STATE_DICT`` checkpoint of an FSDP2 model holds full tensors written by rank 0. Saved synchronously,
every rank all-gathers every parameter and optimizer tensor first, a collective over the live shards. With
``async_save`` the loop only stages each rank's shards (as for a sharded checkpoint); the background writer
then gathers them onto rank 0 on its own gloo group (a 1-D device mesh over that group, so its collectives
never meet the loop's on the training group) and rank 0 writes the same safetensors file a synchronous save
writes: the gather is the one DTensor's ``full_tensor`` does, over the same placements and global shapes.

Only states whose DTensors live on a 1-D mesh of every rank in order, placed ``Shard``/``Replicate``, are
gathered this way (FSDP2's default); others (HSDP, tensor parallel) are gathered in the loop as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

GATHERED = "gathered"
"""The deferred-write kind of a full-tensor file gathered by the writer (see :mod:`.staging`)."""


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor (asked without importing DTensor)."""
    return callable(getattr(value, "to_local", None)) and hasattr(value, "placements")


def gathers_in_background(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether the writer can gather ``tensors`` (some DTensors, all on a 1-D mesh of every rank, Shard/Replicate)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dtensors = [value for value in tensors.values() if isinstance(value, DTensor)]
    if not dtensors or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return False
    world = list(range(dist.get_world_size()))
    for value in dtensors:
        mesh = value.device_mesh
        if mesh.ndim != 1 or mesh.mesh.flatten().tolist() != world:
            return False
        # exact types: _StridedShard (FSDP2 over tensor parallel) is a Shard subclass that needs its own mesh
        if any(type(placement) not in (Shard, Replicate) for placement in value.placements):
            return False
    return True


class WriterMesh:
    """A 1-D CPU device mesh over the writer's process group, made once (collective) on first use."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._mesh: Any = None

    def get(self) -> Any:
        if self._mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            self._mesh = DeviceMesh.from_group(self._group, "cpu")
        return self._mesh


def gather_full(tensors: dict[str, torch.Tensor], mesh: WriterMesh, keep: bool) -> dict[str, torch.Tensor]:
    """Collective on the writer's group: every staged DTensor made whole; kept where ``keep`` (the process that
    writes the file: rank 0, or each node's first), ``{}`` elsewhere.

    Tensors are gathered one at a time, so the other ranks hold one full tensor at most."""
    from torch.distributed.tensor import DTensor

    full: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if is_dtensor(value):
            assert isinstance(value, DTensor)
            # The same shard on the writer's mesh (public API; global shape and stride given, nothing checked).
            value = DTensor.from_local(value.to_local(), device_mesh=mesh.get(), placements=value.placements,
                                       run_check=False, shape=value.shape, stride=value.stride()).full_tensor()
        if keep:
            full[key] = value
    return full
