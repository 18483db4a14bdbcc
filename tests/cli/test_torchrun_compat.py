"""The launcher against torchrun's real parser, on the installed torch and on older torchruns' shapes.

CPU only, no GPU needed. The parser is the installed torch's ``torch.distributed.run.get_args_parser()``; the
older shapes are that same parser with ``--signals_to_handle`` and/or ``--shutdown_timeout`` removed (torch 2.11
lacks the second, torch 2.6 both). The relay tests start real child processes and signal this test process.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import get_args_parser

from trainkit.cli.launch_command import add_arguments, signal_plan, torchrun_arguments
from trainkit.cli.signal_relay import SignalRelay, can_find_children, child_pids
from trainkit.cli.torchrun_compat import installed_torchrun_options, options_of, plan_signals
from trainkit.config import LaunchConfig

SIGNALS, TIMEOUT = "--signals_to_handle", "--shutdown_timeout"


def _launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _parser_without(*options: str) -> argparse.ArgumentParser:
    """The installed torchrun parser with the actions of ``options`` taken out (an older torchrun's shape)."""
    parser = get_args_parser()
    for action in [a for a in parser._actions if set(a.option_strings) & set(options)]:
        parser._remove_action(action)
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        for option in action.option_strings:
            parser._option_string_actions.pop(option, None)
    return parser


LAUNCHES = [  # (config mapping, launch argv): one machine, two machines (static and c10d), output options
    ({"num_processes": 2}, ("--tee", "3", "--log_dir", "/tmp/logs", "-m", "pkg.train", "--lr", "3")),
    ({"num_processes": 4, "num_machines": 2, "main_process_ip": "10.0.0.1", "rdzv_backend": "static"}, ("t.py",)),
    ({"num_processes": 4, "num_machines": 2, "main_process_ip": "10.0.0.1", "max_restarts": 1,
      "preemption_signals": "SIGUSR2", "preemption_grace_period": 300}, ("t.py", "--x")),
]


@pytest.mark.parametrize("removed", [(), (TIMEOUT,), (SIGNALS, TIMEOUT)],
                         ids=["installed", "no-shutdown_timeout", "no-signal-options"])
@pytest.mark.parametrize("mapping, argv", LAUNCHES)
def test_the_command_parses_with_torchruns_own_parser(mapping, argv, removed, capsys):
    parser = _parser_without(*removed)
    options = options_of(parser)
    assert not set(removed) & options
    config = LaunchConfig.from_mapping(mapping, cuda_available=False)
    command = torchrun_arguments(config, _launch_args(*argv), options)
    parsed = parser.parse_args(command)  # argparse exits (status 2) on any option it does not know
    assert parsed.module and parsed.training_script == "trainkit.cli.worker"
    assert parsed.training_script_args[-1] == argv[-1]
    plan = signal_plan(config, options)
    if TIMEOUT in options:
        assert parsed.shutdown_timeout == config.preemption_grace_period
    if SIGNALS in options:
        agent = parsed.signals_to_handle.split(",")
        # The agent gets the stop-at-once signals; the preemption ones go to it only when it honours the grace.
        assert {"SIGHUP", "SIGQUIT"} <= set(agent)
        assert set(plan.relayed).isdisjoint(agent)
    if can_find_children() and TIMEOUT not in options:
        # Every preemption signal the agent would cut at 30 s is relayed by the launcher instead, except the
        # ones a torchrun without --signals_to_handle registers itself (SIGTERM, SIGINT).
        wanted = set(config.preemption_signals.split(","))
        assert set(plan.relayed) == (wanted if SIGNALS in options else wanted - {"SIGTERM", "SIGINT"})


def test_the_installed_torchrun_gets_only_options_it_has():
    config = LaunchConfig.from_mapping({"num_processes": 2}, cuda_available=False)
    command = torchrun_arguments(config, _launch_args("t.py"))
    flags = [word for word in command[:command.index("--module")] if word.startswith("--")]
    assert flags and set(flags) <= installed_torchrun_options()


def test_what_each_torchrun_shape_loses_is_said_once_and_only_then():
    full = frozenset({SIGNALS, TIMEOUT})
    assert plan_signals("SIGTERM,SIGUSR1", 90, full, can_relay=True).notice is None
    # torch 2.11's shape: the launcher relays every preemption signal, nothing is lost.
    shape_211 = plan_signals("SIGTERM,SIGINT,SIGUSR1", 90, frozenset({SIGNALS}), can_relay=True)
    assert shape_211.relayed == ("SIGTERM", "SIGINT", "SIGUSR1") and shape_211.notice is None
    assert shape_211.torchrun_arguments == (SIGNALS, "SIGHUP,SIGQUIT")
    # torch 2.6's shape: the agent always takes SIGTERM/SIGINT and cuts them at 30 s.
    shape_26 = plan_signals("SIGTERM,SIGINT,SIGUSR1", 90, frozenset(), can_relay=True, torch_version="2.6.0")
    assert shape_26.relayed == ("SIGUSR1",) and shape_26.torchrun_arguments == ()
    assert "SIGTERM, SIGINT" in shape_26.notice and "30 s" in shape_26.notice and "=90 s" in shape_26.notice
    # A grace period within the agent's 30 s loses nothing.
    assert plan_signals("SIGTERM", 20, frozenset(), can_relay=True).notice is None
    # No /proc: nothing relayed; a signal the agent does not register cannot be forwarded, and says so.
    blind = plan_signals("SIGTERM,SIGUSR1", 90, frozenset(), can_relay=False)
    assert blind.relayed == () and "SIGUSR1 cannot be forwarded" in blind.notice


_CHILD = """
import signal, sys, time
def stop(signum, frame):
    time.sleep({delay})
    sys.exit(75)
signal.signal(signal.SIGUSR1, stop if {handles} else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _children(count: int, delay: float, handles: bool) -> list[subprocess.Popen]:
    code = _CHILD.format(delay=delay, handles=handles)
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
                for _ in range(count)]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return children


@pytest.mark.skipif(not can_find_children(), reason="the relay needs /proc (Linux)")
def test_the_relay_forwards_waits_for_the_workers_then_hands_the_signal_to_torchrun():
    children = _children(2, delay=0.5, handles=True)
    try:
        assert {child.pid for child in children} <= set(child_pids())
        started = time.monotonic()
        with pytest.raises(SignalException) as raised, SignalRelay(("SIGUSR1",), grace_period=20):
            signal.raise_signal(signal.SIGUSR1)
            time.sleep(30)  # the handler raises before this ends
        assert raised.value.sigval == signal.SIGUSR1
        assert [child.wait(5) for child in children] == [75, 75]  # they saved and exited on their own
        assert time.monotonic() - started < 10
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # restored on exit
    finally:
        for child in children:
            child.kill()


@pytest.mark.skipif(not can_find_children(), reason="the relay needs /proc (Linux)")
def test_the_relay_kills_workers_still_running_after_the_grace_period():
    children = _children(1, delay=0, handles=False)
    try:
        started = time.monotonic()
        with pytest.raises(SignalException), SignalRelay(("SIGUSR1",), grace_period=1):
            signal.raise_signal(signal.SIGUSR1)
            time.sleep(30)
        assert children[0].wait(5) == -signal.SIGKILL
        assert 1 <= time.monotonic() - started < 10
    finally:
        children[0].kill()
