"""Preemption as plain data: the exit code that asks for a requeue, the signals that mean "save and stop".

Shared by the launcher (which forwards these signals and maps the workers' exit code) and the engine
(which handles them in the workers), so both sides read the same names from here. No torch.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError
from .options import Option, integer

PREEMPTED_EXIT_CODE = 75
"""Exit status of a worker (and of ``trainkit launch``) that saved a checkpoint after a stop signal and ended
cleanly: "temporary failure, run again" (``EX_TEMPFAIL`` of sysexits.h). A scheduler requeues on it; the same
command resumes from that checkpoint."""

DEFAULT_PREEMPTION_SIGNALS = "SIGTERM,SIGINT,SIGUSR1"
"""Signals that make a run save and stop: Kubernetes and Slurm's end of job (SIGTERM), Ctrl-C (SIGINT),
Slurm's advance notice ``--signal=USR1@90`` (SIGUSR1)."""

DEFAULT_GRACE_PERIOD = 90
"""Seconds ``trainkit launch`` waits for its workers after forwarding a signal, before SIGKILL (Slurm's
``--signal=...@90`` habit)."""

PREEMPTION_REPORT_ENV = "TRAINKIT_PREEMPTION_REPORT"
"""Folder where each worker that saved and stopped on a signal leaves a note for its launcher (the agent
that stopped the workers does not hand their exit codes back)."""

_NEVER_HANDLED = ("SIGKILL", "SIGSTOP")


def parse_signal_names(value: Any, where: str = "preemption_signals") -> str:
    """``"term, SIGUSR1"`` or ``["SIGTERM", "USR1"]`` -> ``"SIGTERM,SIGUSR1"``; unknown names raise ConfigError."""
    if isinstance(value, str):
        names: Sequence[Any] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, (list, tuple)):
        names = value
    else:
        raise ConfigError(f"Invalid value {value!r} for 'preemption_signals' in {where}: expected signal names "
                          "such as 'SIGTERM,SIGUSR1' (a comma-separated string or a list).")
    canonical: list[str] = []
    for raw in names:
        name = str(raw).strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name in _NEVER_HANDLED or not isinstance(getattr(signal, name, None), signal.Signals):
            valid = "SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, ..."
            reason = "cannot be caught" if name in _NEVER_HANDLED else "is not a signal name"
            raise ConfigError(f"Invalid value {raw!r} in 'preemption_signals' ({where}): {name} {reason}; "
                              f"use names such as {valid}")
        if name not in canonical:
            canonical.append(name)
    if not canonical:
        raise ConfigError(f"'preemption_signals' ({where}) is empty; name at least one signal (default "
                          f"{DEFAULT_PREEMPTION_SIGNALS}).")
    return ",".join(canonical)


def signals_from_names(names: str) -> list[signal.Signals]:
    """The :class:`signal.Signals` of a list produced by :func:`parse_signal_names`."""
    return [getattr(signal, name) for name in parse_signal_names(names).split(",")]


PREEMPTION_SIGNALS = Option(
    help="Signals forwarded to every worker, which then save a checkpoint and stop (default SIGTERM,SIGINT,SIGUSR1; "
         "a comma-separated string or a YAML list; see docs/preemption.md).",
    default=DEFAULT_PREEMPTION_SIGNALS, parse=lambda value, key, where: parse_signal_names(value, where))
PREEMPTION_GRACE_PERIOD = Option(
    help=f"Seconds to wait for the workers to save and exit after a forwarded signal, before SIGKILL (default "
         f"{DEFAULT_GRACE_PERIOD}).", default=DEFAULT_GRACE_PERIOD, parse=integer(0), flag_type=int)
