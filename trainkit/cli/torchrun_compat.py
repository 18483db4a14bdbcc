"""What the installed torchrun accepts, read from its own argument parser, and how preemption signals are
split between torchrun's elastic agent and trainkit's launcher on that torch.

torchrun's options changed between releases: ``--signals_to_handle`` (which signals the agent turns into a
shutdown that forwards them to the workers) is in torch 2.11 but not 2.6, ``--shutdown_timeout`` (how long the
agent then waits before SIGKILL) in 2.13 but not 2.11. Without the first, the agent always handles SIGTERM,
SIGINT, SIGHUP and SIGQUIT itself; without the second it always waits 30 s (``PContext.close``'s default). The parser of the torch
that is installed is the oracle: no option is passed that it does not list.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

SIGNALS_OPTION = "--signals_to_handle"
SHUTDOWN_TIMEOUT_OPTION = "--shutdown_timeout"
# The agent's own stop signals: forwarded to the workers, which stop at once (no checkpoint).
STOP_AT_ONCE_SIGNALS = ("SIGHUP", "SIGQUIT")
# Without --signals_to_handle the agent registers these itself, whatever the launcher asks for.
AGENT_BUILTIN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
# Without --shutdown_timeout the agent waits this long after forwarding a signal, then SIGKILLs.
AGENT_FIXED_GRACE_SECONDS = 30


def options_of(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every option string ``parser`` accepts (both spellings where it has two)."""
    return frozenset(option for action in parser._actions for option in action.option_strings)


@functools.lru_cache(maxsize=1)
def installed_torchrun_options() -> frozenset[str]:
    """The options of the installed torch's ``torch.distributed.run`` parser."""
    from torch.distributed.run import get_args_parser

    return options_of(get_args_parser())


def unknown_options(argv: list[str], options: frozenset[str]) -> list[str]:
    """The ``--option`` words of a torchrun argv (before ``--module``'s target) that ``options`` lacks."""
    found = []
    for word in argv:
        if word in ("--module", "-m", "--no-python", "--no_python"):
            break  # the entry point follows: its own arguments are not torchrun's
        if word.startswith("--") and word.split("=", 1)[0] not in options:
            found.append(word)
    return found


@dataclass(frozen=True)
class SignalPlan:
    """Who handles which signal on this torch, and what the user loses (if anything)."""

    torchrun_arguments: tuple[str, ...]
    """``--signals_to_handle`` / ``--shutdown_timeout`` and their values, for the options this torchrun has."""
    relayed: tuple[str, ...]
    """Preemption signals the launcher forwards itself, waiting the full grace period before SIGKILL."""
    notice: str | None
    """One line saying what this torch cannot do of the configured preemption settings; None when nothing."""


def plan_signals(preemption_signals: str, grace_period: int, options: frozenset[str], *,
                 can_relay: bool, torch_version: str = "this torch") -> SignalPlan:
    """Split the configured ``preemption_signals`` between torchrun's agent and the launcher's own relay.

    With both options, torchrun does everything (forward, wait ``grace_period``, SIGKILL). Without
    ``--shutdown_timeout`` the agent would SIGKILL after 30 s, so the launcher takes the preemption signals
    it can keep away from the agent (``can_relay``: it can find its workers) and forwards them itself.
    """
    wanted = [name for name in preemption_signals.split(",") if name]
    stop_at_once = [name for name in STOP_AT_ONCE_SIGNALS if name not in wanted]
    has_signals, has_timeout = SIGNALS_OPTION in options, SHUTDOWN_TIMEOUT_OPTION in options
    if has_signals and has_timeout:
        return SignalPlan((SIGNALS_OPTION, ",".join(wanted + stop_at_once),
                           SHUTDOWN_TIMEOUT_OPTION, str(grace_period)), (), None)
    arguments: tuple[str, ...] = (SHUTDOWN_TIMEOUT_OPTION, str(grace_period)) if has_timeout else ()
    if has_signals:
        # The agent registers only what it is told: it keeps the stop-at-once signals, the launcher takes the
        # rest (unless it cannot find its workers, or the user made both stop-at-once signals preemption ones:
        # an empty list would make the agent fall back to all four).
        agent_takes = [] if (can_relay and stop_at_once) else wanted
        arguments = (SIGNALS_OPTION, ",".join(agent_takes + stop_at_once)) + arguments
    else:
        agent_takes = [name for name in wanted if name in AGENT_BUILTIN_SIGNALS]
    relayed = tuple(name for name in wanted if name not in agent_takes) if can_relay else ()
    unhandled = [name for name in wanted if name not in agent_takes and name not in relayed]
    lines = []
    if agent_takes and not has_timeout and grace_period > AGENT_FIXED_GRACE_SECONDS:
        lines.append(f"torch {torch_version}'s torchrun has no {SHUTDOWN_TIMEOUT_OPTION}: on {', '.join(agent_takes)} "
                     f"it stops the workers {AGENT_FIXED_GRACE_SECONDS} s after forwarding the signal, not after "
                     f"preemption_grace_period={grace_period} s.")
    if unhandled:  # no --signals_to_handle and no relay (no /proc): the signal's default action applies
        lines.append(f"{', '.join(unhandled)} cannot be forwarded to the workers on torch {torch_version} here: "
                     "it stops the launcher and its workers without a checkpoint.")
    notice = ("trainkit launch: " + " ".join(lines)) if lines else None
    return SignalPlan(arguments, relayed, notice)
