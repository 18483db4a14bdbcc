"""Accelerate's process-identity attributes (``device``, ``process_index``, ...), read from the process state.

``Accelerator`` (and anything else holding a ``state``) gets them by inheriting :class:`ProcessIdentity`:
each is one read of the process state (an Accelerator's ``state`` is an ``AcceleratorState`` view of
:class:`trainkit.engine.process.state.ProcessState`), so the facade does not repeat them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainkit.engine.process.state import ProcessState
    from trainkit.engine.process.state_views import AcceleratorState


class ProcessIdentity:
    """Read-only identity of this process, under Accelerate's names."""

    state: ProcessState | AcceleratorState

    device = property(lambda self: self.state.device, doc="The device this process computes on.")
    # Accelerate's names on the state too: after AcceleratorState._reset_state() they raise its explanation.
    process_index = property(lambda self: self.state.process_index, doc="Global rank of this process.")
    local_process_index = property(lambda self: self.state.local_process_index,
                                   doc="Rank of this process on its machine.")
    num_processes = property(lambda self: self.state.num_processes, doc="Number of processes in the job.")
    is_main_process = property(lambda self: self.state.is_main_process, doc="True on global rank 0.")
    is_local_main_process = property(lambda self: self.state.is_local_main_process,
                                     doc="True on the first process of each machine.")
    is_last_process = property(lambda self: self.state.is_last_process, doc="True on the highest global rank.")
    use_distributed = property(lambda self: self.state.use_distributed,
                               doc="True when more than one process takes part.")
