"""Preemption settings without processes (CPU): signal names and grace period from files and flags, what the
launcher hands torchrun's agent, the Trainer's switch, and the single-process watch."""

from __future__ import annotations

import argparse
import os
import signal
import types

import pytest

from trainkit.cli.config_flags import flags_to_mapping
from trainkit.cli.launch_command import add_arguments, torchrun_arguments
from trainkit.cli.torchrun_compat import installed_torchrun_options
from trainkit.cli.preemption_report import PreemptionReport
from trainkit.config import ConfigError, LaunchConfig
from trainkit.config.preemption import PREEMPTED_EXIT_CODE, parse_signal_names


def _launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_signal_names_are_normalised_and_bad_ones_named():
    assert parse_signal_names("term, SIGUSR1,sigterm") == "SIGTERM,SIGUSR1"
    assert parse_signal_names(["USR2", "SIGINT"]) == "SIGUSR2,SIGINT"
    with pytest.raises(ConfigError, match="SIGKILL cannot be caught"):
        parse_signal_names("SIGTERM,KILL")
    with pytest.raises(ConfigError, match="'SIGTREM' in 'preemption_signals'"):
        parse_signal_names("SIGTREM")
    with pytest.raises(ConfigError, match="is empty"):
        parse_signal_names(" , ")
    with pytest.raises(ConfigError, match=r"preemption_grace_period.*>= 0"):
        LaunchConfig.from_mapping({"preemption_grace_period": -1}, source="my.yaml")


def test_launcher_hands_signals_and_grace_period_to_torchruns_agent():
    # A torchrun with both options (torch 2.13); older ones: tests/cli/test_torchrun_compat.py.
    both = installed_torchrun_options() | {"--signals_to_handle", "--shutdown_timeout"}
    default = LaunchConfig.from_mapping({"num_processes": 2}, cuda_available=False)
    argv = torchrun_arguments(default, _launch_args("t.py"), both)
    assert argv[argv.index("--signals_to_handle") + 1] == "SIGTERM,SIGINT,SIGUSR1,SIGHUP,SIGQUIT"
    assert argv[argv.index("--shutdown_timeout") + 1] == "90"
    # A YAML key, overridden by a flag; the flag wins and provenance says so.
    args = _launch_args("--preemption_signals", "USR2", "--preemption_grace_period", "300", "t.py")
    config = LaunchConfig.resolve([({"num_processes": 2, "preemption_signals": ["TERM"]}, "c.yaml"),
                                   (flags_to_mapping(args), "flag")], cuda_available=False)
    assert (config.preemption_signals, config.preemption_grace_period) == ("SIGUSR2", 300)
    assert config.source_of("preemption_signals") == "flag"
    argv = torchrun_arguments(config, args, both)
    assert argv[argv.index("--signals_to_handle") + 1] == "SIGUSR2,SIGHUP,SIGQUIT"
    assert argv[argv.index("--shutdown_timeout") + 1] == "300"
    # trainkit's own keys stay out of files at their defaults (accelerate launch rejects unknown keys).
    assert "preemption_signals" not in default.to_dict() and config.to_dict()["preemption_grace_period"] == 300


def test_launcher_exit_code_from_the_workers_notes():
    with PreemptionReport() as report:
        assert report.saved_ranks() == []
        with open(os.path.join(report.folder, "rank-1.json"), "w") as handle:
            handle.write('{"rank": 1, "step": 7, "checkpoint": "out/checkpoint-7", "signal": "SIGTERM"}')
        assert report.saved_ranks() == [1]
        assert "saved out/checkpoint-7" in report.describe("SIGTERM") and "exiting with 75" in report.describe(None)
        preempted = types.SimpleNamespace(failures={0: types.SimpleNamespace(exitcode=PREEMPTED_EXIT_CODE),
                                                    1: types.SimpleNamespace(exitcode=PREEMPTED_EXIT_CODE)})
        mixed = types.SimpleNamespace(failures={0: types.SimpleNamespace(exitcode=1),  # a crash, no note
                                                1: types.SimpleNamespace(exitcode=PREEMPTED_EXIT_CODE)})
        assert report.all_preempted(preempted) and not report.all_preempted(mixed)
        # Rank 1 saved (its note) and was stopped by the agent while exiting, after rank 0 exited with 75.
        stopped_while_exiting = types.SimpleNamespace(failures={0: types.SimpleNamespace(exitcode=PREEMPTED_EXIT_CODE),
                                                                1: types.SimpleNamespace(exitcode=-15)})
        assert report.all_preempted(stopped_while_exiting)
        folder = report.folder
    assert not os.path.exists(folder)


def test_trainer_switch_follows_saving_unless_set():
    from trainkit import TrainingArguments
    from trainkit.trainer.checkpointing.preemption import is_enabled

    assert is_enabled(TrainingArguments(output_dir="o"))
    assert not is_enabled(TrainingArguments(output_dir="o", save_strategy="no"))
    assert is_enabled(TrainingArguments(output_dir="o", save_strategy="no", enable_jit_checkpoint=True))
    assert not is_enabled(TrainingArguments(output_dir="o", enable_jit_checkpoint=False))


def test_single_process_watch_flags_and_restores_handlers():
    """One process: the first signal only raises the flag; a repeat within the window is ignored; close()
    puts the previous handlers back."""
    from trainkit.engine.process.preemption import PreemptionWatch

    previous = signal.getsignal(signal.SIGUSR1)
    watch = PreemptionWatch(signals=[signal.SIGUSR1]).start()
    try:
        assert not watch.poll()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # a duplicate delivery: must not kill the test process
        assert watch.received == signal.SIGUSR1 and watch.poll()
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGUSR1) == previous
