"""Staging for asynchronous saves: tensor writes are recorded instead of run, and their tensors copied into host
buffers reused from one save to the next, whose memory is set up before the first save is due.

:class:`DeferredWrites` is the :class:`~.sinks.FileSink` an asynchronous save is captured into: the writers hand it
their tensors and paths instead of writing, and their small files as bytes (made now: a snapshot). After the
capture, :meth:`HostBufferPool.stage` copies every recorded tensor into the pool's buffers (pinned memory for CUDA
tensors), after which training may change the originals; :meth:`DeferredWrites.replay` later runs the same writers
on the copies, so the files are byte for byte those of a synchronous save.

The first save used to pay for the pool's memory: allocating hundreds of megabytes and touching every page of it
(and pinning it, for CUDA) while the loop waited. :meth:`HostBufferPool.reserve` does that ahead, in a background
thread, when the objects are prepared and again once the optimizers hold state; the save then carves its buffers
out of memory that is ready.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .sinks import FileSink

if TYPE_CHECKING:
    from .storage.base import CheckpointStorage

logger = logging.getLogger(__name__)

HOST_MEMORY_MARGIN = 0.8
"""Staging may take at most this share of the host memory available when a save starts."""
_ALIGN = 64


@dataclasses.dataclass
class DeferredWrite:
    """One recorded write: which writer, its tensors (originals, then staged copies), its path, or its bytes."""

    kind: str  # "safetensors" (one file, this process), "sharded" (DCP folder, collective), "gathered" (full
    # tensors gathered onto the writing ranks, written as one safetensors file: collective) or "data" (small file)
    tensors: dict[str, torch.Tensor]
    path: str
    data: bytes = b""


class HostBufferPool:
    """Host buffers for staged tensors, kept between saves and reused when shape and dtype still match; new ones
    are carved from memory reserved (and touched) ahead of the save when there is some."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}
        self._slabs: list[list] = []  # [memory, bytes used] reserved ahead of saves, carved in order
        self._reserving: threading.Thread | None = None
        self._announced = False
        self.reserved_bytes = 0
        """Bytes reserved ahead of the first save (0 until a reservation has finished)."""
        self.allocated_during_saves = 0
        """Bytes a save had to allocate itself (what the reservation did not cover)."""

    @property
    def nbytes(self) -> int:
        """Host memory the pool's buffers hold now."""
        return sum(_nbytes(buffer) for buffer in self._buffers.values())

    def reserve(self, nbytes: int, pinned: bool = False) -> None:
        """Set up ``nbytes`` more of staging memory in a background thread (allocated and touched; pinned for
        CUDA tensors). A save waits for a reservation still running, then uses it."""
        self.wait_reserved()
        if nbytes <= 0 or not staging_fits(nbytes)[0]:
            return  # too big for the host now: a save decides again (and says so) when it comes

        def allocate() -> None:
            slab = torch.empty(nbytes + _ALIGN * 1024, dtype=torch.uint8, pin_memory=pinned)
            slab.zero_()  # touch every page now, not during the save
            self._slabs.append([slab, 0])
            self.reserved_bytes += nbytes

        self._reserving = threading.Thread(target=allocate, name="trainkit-staging-reserve", daemon=True)
        self._reserving.start()

    def wait_reserved(self) -> None:
        """Wait for a reservation in progress (if any)."""
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    def missing_bytes(self, writes: list[DeferredWrite], root: str) -> int:
        """Bytes of new memory that staging ``writes`` would allocate (neither reusable nor reserved)."""
        total = 0
        for write in writes:
            place = _place(write, root)
            for key, tensor in write.tensors.items():
                local = _local(tensor)
                if not _fits(self._buffers.get((place, key)), local):
                    total += _nbytes(local)
        self.wait_reserved()
        return max(0, total - sum(slab.numel() - used for slab, used in self._slabs))

    def _new_buffer(self, local: torch.Tensor) -> torch.Tensor:
        nbytes = _nbytes(local)
        for entry in self._slabs:
            slab, used = entry
            start = -(-used // _ALIGN) * _ALIGN
            if nbytes and start + nbytes <= slab.numel() and (not local.is_cuda or slab.is_pinned()):
                entry[1] = start + nbytes
                return slab[start:start + nbytes].view(local.dtype).view(local.shape)
        self.allocated_during_saves += nbytes
        buffer = torch.empty(local.shape, dtype=local.dtype)
        return buffer.pin_memory() if local.is_cuda else buffer  # device-to-host copies run asynchronously

    def stage(self, writes: list[DeferredWrite], root: str) -> None:
        """Replace every recorded tensor by a host copy (the pool's buffer for its slot)."""
        self.wait_reserved()
        used: set[tuple[str, str]] = set()
        wait_for_device = False
        for write in writes:
            staged: dict[str, torch.Tensor] = {}
            place = _place(write, root)
            for key, tensor in write.tensors.items():
                slot = (place, key)
                local = _local(tensor).detach()
                buffer = self._buffers.get(slot)
                if not _fits(buffer, local):
                    buffer = self._buffers[slot] = self._new_buffer(local)
                assert buffer is not None
                buffer.copy_(local, non_blocking=local.is_cuda)
                wait_for_device = wait_for_device or local.is_cuda
                used.add(slot)
                staged[key] = _rewrap(tensor, buffer)
            write.tensors = staged
        if wait_for_device:
            torch.cuda.synchronize()  # the copies are complete before training may change the originals
        for slot in set(self._buffers) - used:  # tensors that no longer exist (e.g. a model freed)
            del self._buffers[slot]
        if not self._announced:
            self._announced = True
            logger.info("Asynchronous checkpoints: %.1f MiB of host memory hold this process's staged copy "
                        "(reused by every save).", self.nbytes / 2**20)


def _place(write: DeferredWrite, root: str) -> str:
    # The staging folder's name changes with every save; the file's place inside it does not. A slot is (place, key).
    return write.path[len(root):] if write.path.startswith(root) else write.path


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if callable(to_local) else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def staged_bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes staging these tensors (this rank's shards of distributed ones) takes."""
    return sum(_nbytes(_local(tensor)) for tensor in tensors)


def _fits(buffer: torch.Tensor | None, tensor: torch.Tensor) -> bool:
    return buffer is not None and buffer.shape == tensor.shape and buffer.dtype == tensor.dtype


def _rewrap(original: torch.Tensor, local_copy: torch.Tensor) -> torch.Tensor:
    """The copy in the original's form: a DTensor again (same mesh, placements and global shape) for a DTensor.

    Built from the original's spec directly, as DCP's own staging does: ``DTensor.from_local`` would move a host
    copy back to the mesh's device (CUDA), which is exactly what staging avoids."""
    if not callable(getattr(original, "to_local", None)):
        return local_copy
    from torch.distributed.tensor import DTensor

    assert isinstance(original, DTensor)
    return DTensor(local_copy, original._spec, requires_grad=False)


class DeferredWrites(FileSink):
    """The writes of one asynchronous save, recorded during its capture and replayed by the background writer."""

    defers = True

    def __init__(self, storage: CheckpointStorage, root: str, gathers: bool) -> None:
        super().__init__(storage)
        self.root = root
        self.writes: list[DeferredWrite] = []
        self._gathers = gathers

    def tensors(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        self.writes.append(DeferredWrite("safetensors", dict(tensors), path))

    def sharded(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        self.writes.append(DeferredWrite("sharded", dict(tensors), path))

    def gathered(self, tensors: dict[str, torch.Tensor], path: str) -> bool:
        from .background_gather import gathers_in_background

        if not self._gathers or not gathers_in_background(tensors):
            return False
        self.writes.append(DeferredWrite("gathered", dict(tensors), path))
        return True

    def data(self, data: bytes, path: str) -> None:
        self.writes.append(DeferredWrite("data", {}, path, bytes(data)))

    def replay(self, sink: FileSink, write_gathered: Callable[[dict[str, torch.Tensor], str, bool], None]
               ) -> BaseException | None:
        """Run the recorded writes into ``sink``; return the first error (after it, files of this process are
        skipped, but sharded and gathered writes still run: they are collective, and the other ranks wait in
        them; ``write_gathered``'s last argument says whether to write the file after gathering)."""
        failure: BaseException | None = None
        for write in self.writes:
            try:
                if write.kind == "sharded":
                    sink.sharded(write.tensors, write.path)
                elif write.kind == "gathered":
                    write_gathered(write.tensors, write.path, failure is None)
                elif failure is None and write.kind == "data":
                    sink.data(write.data, write.path)
                elif failure is None:
                    sink.tensors(write.tensors, write.path)
            except Exception as error:  # handed to the commit, which abandons the checkpoint on every rank
                failure = failure or error
        return failure


def available_host_memory() -> int | None:
    """Bytes of memory the host can still give (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # not Linux: staging is not limited
        pass
    return None


def staging_fits(missing_bytes: int) -> tuple[bool, str]:
    """Whether ``missing_bytes`` of new buffers fit in host memory; and the figures, for the notice."""
    if missing_bytes == 0:
        return True, ""
    free = available_host_memory()
    if free is None:
        return True, ""
    fits = missing_bytes <= HOST_MEMORY_MARGIN * free
    return fits, f"staging needs {missing_bytes / 2**20:.0f} MiB, the host has {free / 2**20:.0f} MiB available"
