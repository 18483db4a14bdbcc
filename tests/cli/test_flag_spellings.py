"""`trainkit launch` / `trainkit config` take every ``--some_flag`` as ``--some-flag`` too, as Accelerate's launcher
does (found by Accelerate's own test_cli, LaunchArgTester). CPU only; no process is started."""

from __future__ import annotations

import argparse

import pytest

from trainkit.cli.main import build_parser


def _command_parser(name: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


UNDERSCORES = ["--multi_gpu", "--use_fsdp", "--num_processes", "4", "--mixed_precision", "bf16",
               "--fsdp_sharding_strategy", "FULL_SHARD", "--gradient_accumulation_steps", "2"]


@pytest.mark.parametrize("command", ["launch", "config"])
def test_hyphen_spellings_set_what_the_underscore_ones_set(command):
    hyphens = [word.replace("_", "-") if word.startswith("--") else word for word in UNDERSCORES]
    tail = ["train.py", "--lr_scale", "2"] if command == "launch" else []
    parser = _command_parser(command)
    with_underscores = vars(parser.parse_args(UNDERSCORES + tail))
    with_hyphens = vars(parser.parse_args(hyphens + tail))
    assert with_hyphens == with_underscores
    assert with_hyphens["num_processes"] == 4 and with_hyphens["multi_gpu"] is True


def test_script_arguments_keep_their_spelling():
    """Only trainkit's own options are aliased: the script's arguments after its path are passed as typed."""
    args = _command_parser("launch").parse_args(["--num-processes", "2", "train.py", "--some_flag", "--other-flag"])
    assert args.training_script_args == ["--some_flag", "--other-flag"]


def test_no_abbreviations_as_in_accelerate():
    """Accelerate's launch parser takes no prefixes of flags; neither does trainkit's (a prefix would otherwise be
    ambiguous between the two spellings)."""
    with pytest.raises(SystemExit):
        _command_parser("launch").parse_args(["--mixed", "bf16", "train.py"])
    launch = pytest.importorskip("accelerate.commands.launch", reason="Accelerate (the oracle) is a dev-venv package")
    assert launch.launch_command_parser().allow_abbrev is False


def test_help_lists_the_declared_spelling_only():
    text = _command_parser("launch").format_help()
    assert "--num_processes" in text and "--mixed_precision" in text
    # the options list declared spellings only; the description names the hyphen form once, as its example
    assert text.count("--num-processes") == 1 and "--mixed-precision" not in text
    assert "--max-restarts" not in text and "--rdzv-backend" not in text  # torchrun's hyphen forms: accepted, unlisted


def test_every_accelerate_launch_flag_spelled_with_hyphens_is_known():
    """The oracle: each option of Accelerate's own launch parser, in its hyphen spelling, is one trainkit knows."""
    launch = pytest.importorskip("accelerate.commands.launch", reason="Accelerate (the oracle) is a dev-venv package")
    ours = _command_parser("launch")._option_string_actions
    theirs = {option for action in launch.launch_command_parser()._actions for option in action.option_strings
              if option.startswith("--")}
    known_underscored = {option for option in theirs if "_" in option and option in ours}
    assert len(known_underscored) > 40
    missing = sorted(option.replace("_", "-") for option in known_underscored if option.replace("_", "-") not in ours)
    assert missing == []
