"""Preemption: every rank stops at the same step when a stop signal reaches any of them, saves once, exits.

A :class:`PreemptionWatch` handles the preemption signals (SIGTERM, SIGINT, SIGUSR1 unless the launcher
says otherwise): the first one only raises a flag. The training loop calls :meth:`PreemptionWatch.poll`
at every step boundary, the same number of times on every rank. Ranks agree without a per-step cost:
every few steps (about every ``check_interval`` seconds) each rank starts a non-blocking all-reduce (MAX)
of ``[flag, seconds per step]`` on a small gloo group and reads its result at the next boundary, after it
finished in the background during the step. Every rank reads the same result at the same boundary, so
all stop at the same step; the agreed step time also sets the next interval, identically everywhere.
A signal is therefore acted on within about ``check_interval`` seconds plus one step.

Then the caller saves (the Trainer a ``checkpoint-N``, the engine ``save_state``) and calls
:meth:`PreemptionWatch.exit_after_save`: it leaves a note for ``trainkit launch``, ends the process group
and raises :class:`Preempted`, a ``SystemExit`` with :data:`PREEMPTED_EXIT_CODE`.

A second signal more than :data:`DUPLICATE_WINDOW_S` after the first stops the process at once with that
signal (as it would have without trainkit): the atomic checkpoint writer leaves the previous checkpoint
intact. Repeats within the window are the same notice delivered twice (Slurm signals both the launcher,
which forwards it, and the workers) and are ignored.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from trainkit.config import load_launch_config_from_env
from trainkit.config.files import write_text_atomic
from trainkit.config.preemption import (
    DEFAULT_PREEMPTION_SIGNALS,
    PREEMPTED_EXIT_CODE,
    PREEMPTION_REPORT_ENV,
    signals_from_names,
)

logger = logging.getLogger(__name__)

DEFAULT_CHECK_INTERVAL_S = 0.5
"""Seconds between agreement rounds; a round costs one 2-element gloo all-reduce that overlaps a step."""
DUPLICATE_WINDOW_S = 1.0
"""A repeat of a signal within this many seconds of the first is the same notice delivered twice."""
_MAX_STEPS_BETWEEN_CHECKS = 10_000
_side_groups: dict[int, Any] = {}


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is saved: the process exits with :data:`PREEMPTED_EXIT_CODE`."""

    def __init__(self, checkpoint: str | None = None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint = checkpoint


def preemption_signals() -> list[signal.Signals]:
    """The signals this worker treats as "save and stop": the launcher's ``preemption_signals`` or the default."""
    launch = load_launch_config_from_env()
    return signals_from_names(launch.preemption_signals if launch is not None else DEFAULT_PREEMPTION_SIGNALS)


def _agreement_group() -> Any:
    """A gloo group over all ranks (created once per process): the flag never touches a GPU stream."""
    key = id(dist.group.WORLD)
    if key not in _side_groups:
        _side_groups[key] = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _side_groups[key]


class PreemptionWatch:
    """Signal handlers plus a cheap cross-rank agreement on when to stop (see the module doc)."""

    def __init__(self, signals: Sequence[signal.Signals] | None = None,
                 check_interval: float = DEFAULT_CHECK_INTERVAL_S) -> None:
        self.signals = list(signals) if signals is not None else preemption_signals()
        self.check_interval = check_interval
        self.received: signal.Signals | None = None
        """The first preemption signal this process received, if any."""
        self._stopped = False
        self._received_at = 0.0
        self._previous: dict[signal.Signals, Any] = {}
        self._world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._group: Any = None
        self._tick = 0
        self._launch_at = 1
        self._read_at = 0
        self._last_launch = (0, time.perf_counter())
        self._pending: Any = None
        self._buffer = torch.zeros(2, dtype=torch.float64)

    # -- signals ---------------------------------------------------------------------------------
    def start(self) -> PreemptionWatch:
        """Install the handlers (main thread only) and, on several processes, the agreement group."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        else:
            logger.warning("Preemption signals are not handled: the training loop does not run in the main thread.")
        if self._world > 1:
            self._group = _agreement_group()
        self._last_launch = (0, time.perf_counter())
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signal.Signals(signum), now
            logger.warning("Rank %d received %s: every process will stop at the next agreed step boundary and save "
                           "a checkpoint (a second %s stops this process at once).", _rank(), self.received.name,
                           self.received.name)
            return
        if now - self._received_at < DUPLICATE_WINDOW_S:
            return  # the same notice, delivered both directly and through the launcher
        logger.warning("Second %s: stopping now without saving; the previous checkpoint is intact.",
                       signal.Signals(signum).name)
        self.close(wait=False)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def close(self, wait: bool = True) -> None:
        """Restore the previous handlers; finish an agreement round under way (all ranks close together).

        A signal received but not acted on (the loop ended first) is then delivered again, to the restored
        handler: the process stops as it would have without the watch, instead of the signal being lost.
        """
        if wait and self._pending is not None:
            self._pending.wait()
        self._pending = None
        if threading.current_thread() is threading.main_thread():
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        installed, self._previous = bool(self._previous), {}
        if wait and installed and self.received is not None and not self._stopped:
            logger.warning("The loop ended before the processes agreed to stop on %s; passing the signal on.",
                           self.received.name)
            signal.raise_signal(self.received)

    # -- agreement ---------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Call at every step boundary, equally often on every rank: True on all ranks at once when they must stop."""
        self._tick += 1
        if self._world == 1:
            self._stopped = self.received is not None
            return self._stopped
        if self._pending is not None and self._tick >= self._read_at:
            self._pending.wait()
            self._pending = None
            stop_flag, seconds_per_step = self._buffer.tolist()
            if stop_flag > 0:
                self._stopped = True
                return True
            every = math.ceil(self.check_interval / seconds_per_step) if seconds_per_step > 0 else 1
            self._launch_at = self._last_launch[0] + min(max(every, 1), _MAX_STEPS_BETWEEN_CHECKS)
        if self._pending is None and self._tick >= self._launch_at:
            now = time.perf_counter()
            # Seconds per step since the previous round; unknown (0: check again next step) before the first.
            last_tick, last_time = self._last_launch
            seconds_per_step = (now - last_time) / (self._tick - last_tick) if last_tick else 0.0
            self._buffer = torch.tensor([1.0 if self.received is not None else 0.0, seconds_per_step],
                                        dtype=torch.float64)
            self._pending = dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
            self._read_at = self._tick + 1
            self._last_launch = (self._tick, now)
        return False

    # -- stopping ----------------------------------------------------------------------------------
    def describe_cause(self) -> str:
        """"SIGTERM on this process" or "a signal on another process", for the logs."""
        return f"{self.received.name} received" if self.received is not None else "a stop signal on another process"

    def exit_after_save(self, checkpoint: str | None, step: int | None = None, state: Any = None) -> None:
        """Note the save for the launcher, end the process group cleanly, raise :class:`Preempted`."""
        self.close(wait=False)
        rank = _rank()
        _write_launcher_note(rank, checkpoint, step, self.received)
        if rank == 0:
            at_step = f" at step {step}" if step is not None else ""
            logger.warning("Preemption: saved %s%s; exiting with code %d (requeue the job or rerun the same command "
                           "to resume).", checkpoint, at_step, PREEMPTED_EXIT_CODE)
        if state is not None:
            state.wait_for_everyone()
            state.shutdown()
        raise Preempted(checkpoint)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _write_launcher_note(rank: int, checkpoint: str | None, step: int | None, received: signal.Signals | None) -> None:
    folder = os.environ.get(PREEMPTION_REPORT_ENV)
    if not folder or not os.path.isdir(folder):
        return  # not started by `trainkit launch`
    note = {"rank": rank, "step": step, "checkpoint": checkpoint, "signal": received.name if received else None}
    try:
        write_text_atomic(os.path.join(folder, f"rank-{rank}.json"), json.dumps(note))
    except OSError:  # the exit code still says it
        pass


def check_accelerator(accelerator: Any) -> None:
    """``Accelerator.check_preemption``: poll; on an agreed stop, ``save_state()`` to the automatic folder and exit."""
    watch = getattr(accelerator, "_preemption_watch", None)
    if watch is None:
        if not accelerator.project_configuration.automatic_checkpoint_naming:
            raise ValueError("check_preemption() saves with save_state() into the project's automatic checkpoint "
                             "folder: create the Accelerator with project_config=ProjectConfiguration(project_dir=..., "
                             "automatic_checkpoint_naming=True).")
        watch = accelerator._preemption_watch = PreemptionWatch().start()
    if watch.poll():
        if accelerator.is_main_process:
            logger.warning("Preemption (%s): every process stops here and saves its state.", watch.describe_cause())
        # Any save in flight is finished first; this one is durable before the process exits.
        folder = accelerator.save_state(synchronous=True)
        accelerator.end_training()
        watch.exit_after_save(folder, state=accelerator.state)


def stop_watching(accelerator: Any) -> None:
    """Restore the signal handlers ``check_preemption`` installed (called by ``end_training``)."""
    watch = getattr(accelerator, "_preemption_watch", None)
    if watch is not None:
        watch.close()
        accelerator._preemption_watch = None
