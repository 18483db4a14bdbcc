"""Staging for asynchronous saves: tensor writes are recorded instead of run, and their tensors copied into
host buffers that are reused from one save to the next.

While a :class:`DeferredWrites` is active (``with recording(...):``), the functions that write tensor files
(:func:`.state_io.save_tensors`, :func:`.sharded_io.save_sharded`) hand their tensors and path to it instead of
writing, and :func:`.state_io.write_json` its text (serialised at once: a snapshot). Other small files a caller
writes itself (the Trainer's ``training_args.json``, a model's ``config.json``) are written at once. After the capture,
:meth:`DeferredWrites.stage` copies every recorded tensor into a :class:`HostBufferPool` (pinned memory for CUDA
tensors), after which training may change the originals; :meth:`DeferredWrites.replay` later runs the very
same writers on the copies, so the files are byte for byte those a synchronous save writes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar[DeferredWrites | None] = contextvars.ContextVar("trainkit_deferred_writes", default=None)

HOST_MEMORY_MARGIN = 0.8
"""Staging may take at most this share of the host memory available when a save starts."""


def active_recorder() -> DeferredWrites | None:
    """The recorder of the save being captured on this thread, or None (write immediately)."""
    return _ACTIVE.get()


@dataclasses.dataclass
class DeferredWrite:
    """One recorded tensor write: which writer, its tensors (originals, then staged copies) and its path."""

    kind: str  # "safetensors" (one file, this process), "sharded" (DCP folder, collective), "gathered" (full
    # tensors gathered onto rank 0, which writes them as one safetensors file: collective) or "text" (JSON)
    tensors: dict[str, torch.Tensor]
    path: str
    text: str = ""


class HostBufferPool:
    """Host buffers for staged tensors, kept between saves and reused when shape and dtype still match."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}
        self._announced = False

    @property
    def nbytes(self) -> int:
        """Host memory the pool holds now."""
        return sum(_nbytes(buffer) for buffer in self._buffers.values())

    def missing_bytes(self, writes: list[DeferredWrite], root: str) -> int:
        """Bytes of new buffers that staging ``writes`` would allocate (those the pool cannot reuse)."""
        total = 0
        for write in writes:
            place = _place(write, root)
            for key, tensor in write.tensors.items():
                local = _local(tensor)
                if not _fits(self._buffers.get((place, key)), local):
                    total += _nbytes(local)
        return total

    def stage(self, writes: list[DeferredWrite], root: str) -> None:
        """Replace every recorded tensor by a host copy (the pool's buffer for its slot)."""
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
                    buffer = torch.empty(local.shape, dtype=local.dtype)
                    if local.is_cuda:
                        buffer = buffer.pin_memory()  # device-to-host copies run asynchronously from pinned memory
                    self._buffers[slot] = buffer
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
    # The staging folder's name changes with every save; the file's place inside it does not. A buffer's slot
    # is (place, key).
    return os.path.relpath(write.path, root)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if callable(to_local) else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


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


class DeferredWrites:
    """The tensor writes of one save, recorded during its capture and replayed by the writer."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.writes: list[DeferredWrite] = []

    def defer(self, kind: str, tensors: dict[str, torch.Tensor], path: str) -> None:
        """Record a write (called by the tensor writers while this recorder is active)."""
        self.writes.append(DeferredWrite(kind, dict(tensors), os.fspath(path)))

    def defer_text(self, text: str, path: str) -> None:
        """Record a small text file (JSON already serialised: a snapshot of the state as it is now)."""
        self.writes.append(DeferredWrite("text", {}, os.fspath(path), text))

    def replay(self, write_safetensors: Callable[[dict[str, torch.Tensor], str], None],
               write_sharded: Callable[[dict[str, torch.Tensor], str], None],
               write_text: Callable[[str, str], None],
               write_gathered: Callable[[dict[str, torch.Tensor], str, bool], None] | None = None) -> BaseException | None:
        """Run the recorded writes; return the first error (after it, files of this process are skipped, but
        sharded and gathered writes still run: they are collective, and the other ranks wait in them;
        ``write_gathered``'s last argument says whether to write the file after gathering)."""
        failure: BaseException | None = None
        for write in self.writes:
            try:
                if write.kind == "sharded":
                    write_sharded(write.tensors, write.path)
                elif write.kind == "gathered":
                    if write_gathered is None:
                        raise RuntimeError(f"{write.path}: a gathered write needs the writer's gather")
                    write_gathered(write.tensors, write.path, failure is None)
                elif failure is None and write.kind == "text":
                    write_text(write.text, write.path)
                elif failure is None:
                    write_safetensors(write.tensors, write.path)
            except Exception as error:  # handed to the commit, which abandons the checkpoint on every rank
                failure = failure or error
        return failure


@contextlib.contextmanager
def recording(recorder: DeferredWrites) -> Iterator[DeferredWrites]:
    """Within the block, tensor writes on this thread are recorded by ``recorder`` instead of run."""
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


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


def describe(value: Any) -> str:
    """``TypeName: message`` of an error, for messages that cross processes."""
    return f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)
