"""The launcher forwards preemption signals itself where torchrun's agent cannot honour the grace period.

Used only on a torch whose torchrun lacks ``--shutdown_timeout`` (its agent SIGKILLs the workers 30 s after
forwarding a signal) or ``--signals_to_handle`` (its agent forwards only SIGTERM, SIGINT, SIGHUP, SIGQUIT; any
other signal's default action ends the launcher and, through the workers' parent-death signal, the workers).
For each signal it owns, the relay sends it to every worker (the launcher's child processes, found in /proc),
waits up to the grace period for them to exit, SIGKILLs any left, then raises torch's own ``SignalException``
so the agent shuts down and the launcher reports the preemption exactly as when torchrun forwards.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

logger = logging.getLogger(__name__)

_PROC = Path("/proc")
_POLL_SECONDS = 0.2


def can_find_children() -> bool:
    """True where the launcher can list its child processes (Linux's /proc)."""
    return (_PROC / "self" / "stat").is_file()


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (state first), or None when the process is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def child_pids(parent: int | None = None) -> list[int]:
    """The live (not zombie) child processes of ``parent`` (this process by default)."""
    parent = os.getpid() if parent is None else parent
    children = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and len(fields) > 1 and fields[1] == str(parent) and fields[0] != "Z":
            children.append(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > 0 and fields[0] not in ("Z", "X")


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # exited meanwhile


class SignalRelay:
    """While entered (in the main thread), own ``names``: forward, wait ``grace_period`` s, then stop the agent."""

    def __init__(self, names: tuple[str, ...], grace_period: int) -> None:
        self.signals = tuple(signal.Signals[name] for name in names)
        self.grace_period = grace_period
        self._previous: dict[signal.Signals, Any] = {}
        self._workers: list[int] = []
        self._relaying = False

    def __enter__(self) -> SignalRelay:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._relaying:  # a repeat while waiting: pass it on (workers stop at once on a second signal)
            for pid in self._workers:
                _send(pid, signum)
            return
        self._relaying = True
        self._workers = child_pids()
        logger.warning("trainkit launch: %s received: forwarded to %d workers; waiting up to %d s for them to save "
                       "and exit.", sig.name, len(self._workers), self.grace_period)
        for pid in self._workers:
            _send(pid, signum)
        deadline = time.monotonic() + self.grace_period
        while any(_alive(pid) for pid in self._workers) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        left = [pid for pid in self._workers if _alive(pid)]
        for pid in left:
            _send(pid, signal.SIGKILL)
        if left:
            logger.warning("trainkit launch: %d workers still ran %d s after %s; killed them.",
                           len(left), self.grace_period, sig.name)
        from torch.distributed.elastic.multiprocessing.api import SignalException

        # torch's own handler raises the same: the agent shuts down (nothing left to stop) and re-raises it.
        raise SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)
