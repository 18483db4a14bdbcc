"""Accelerate's process-identity attributes (``device``, ``process_index``, ...), read from the process state.

``Accelerator`` (and anything else holding a ``state``) gets them by inheriting :class:`ProcessIdentity`:
each is one read of :class:`trainkit.engine.process.state.ProcessState`, so the facade does not repeat them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainkit.engine.process.state import ProcessState


class ProcessIdentity:
    """Read-only identity of this process, under Accelerate's names."""

    state: ProcessState

    device = property(lambda self: self.state.device, doc="The device this process computes on.")
    process_index = property(lambda self: self.state.rank, doc="Global rank of this process.")
    local_process_index = property(lambda self: self.state.local_rank, doc="Rank of this process on its machine.")
    num_processes = property(lambda self: self.state.world_size, doc="Number of processes in the job.")
    is_main_process = property(lambda self: self.state.is_main_process, doc="True on global rank 0.")
    is_local_main_process = property(lambda self: self.state.is_local_main_process,
                                     doc="True on the first process of each machine.")
    is_last_process = property(lambda self: self.state.is_last_process, doc="True on the highest global rank.")
    use_distributed = property(lambda self: self.state.use_distributed,
                               doc="True when more than one process takes part.")
