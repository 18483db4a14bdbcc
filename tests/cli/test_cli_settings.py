"""Launcher flags reach the engine alike from an Accelerate-style script and a Trainer script (CPU, gloo).

Two launches in all: each worker asserts nothing itself but reports what the engine actually used
(the dtype a unit computes in, accumulation sync pattern or optimizer steps, device, whether FSDP units
stayed unsharded after forward — SHARD_GRAD_OP), and an explicit argument that disagrees with a flag.
"""

from __future__ import annotations

import pytest

from tests.cli.cli_helpers import SCRIPTS, explain, reports, trainkit

FLAGS = ("--num_processes", "2", "--cpu", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "4",
         "--fsdp_sharding_strategy", "SHARD_GRAD_OP")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]
NOTICE = "explicit settings win over the launcher's"


def launch(script: str, tmp_path, *script_args: str) -> tuple[dict[int, dict], list[str]]:
    result = trainkit("launch", *FLAGS, SCRIPTS / script, *script_args, tmp_path=tmp_path, timeout=240)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1], explain(result)
    notices = [line for line in (result.stdout + result.stderr).splitlines() if NOTICE in line]
    return found, notices


def check_flags_acted(report: dict) -> None:
    assert report["device"] == "cpu"
    assert report["mixed_precision"] == "bf16" and report["compute_dtype_in_forward"] == "torch.bfloat16"
    assert report["distributed_type"] == "FSDP" and report["sharded"]
    assert report["resharded_after_forward"] is False  # SHARD_GRAD_OP keeps units gathered until backward
    assert report["provenance"]["mixed_precision"] == "launcher flag --mixed_precision"
    assert report["provenance"]["use_cpu"] == "launcher flag --use_cpu"
    assert report["provenance"]["fsdp.sharding_strategy"] == "launcher flag --fsdp_sharding_strategy"


def test_flags_reach_an_accelerator_script_and_an_explicit_argument_wins_with_one_notice(tmp_path) -> None:
    found, notices = launch("settings_accelerator.py", tmp_path)
    for report in found.values():
        check_flags_acted(report)
        assert report["gradient_accumulation_steps"] == 4
        assert report["syncs"] == [False, False, False, True]  # 4 batches per rank: one window of 4
        assert report["explicit"]["mixed_precision"] == "no"
        assert report["explicit"]["gradient_accumulation_steps"] == 2
        assert report["explicit"]["provenance"]["mixed_precision"] == "Accelerator(mixed_precision=)"
    assert len(notices) == 1, notices  # main process only, both overrides on one line
    assert "mixed_precision='no' from Accelerator(mixed_precision=) overrides 'bf16'" in notices[0]
    assert "gradient_accumulation_steps=2" in notices[0]


def test_flags_reach_a_trainer_script_whose_arguments_set_none_of_them(tmp_path) -> None:
    found, notices = launch("settings_trainer.py", tmp_path, str(tmp_path / "out"))
    for report in found.values():
        check_flags_acted(report)
        assert report["gradient_accumulation_steps"] == 4  # the run's (accelerator.config)
        # The arguments stay what the script wrote (transformers' Trainer never writes a launcher's value into
        # them); the engine holds the run's one number (transformers' own Trainer gives Accelerate num_steps=1).
        assert (report["arguments_accumulation"], report["engine_accumulation"]) == (1, 4)
        assert report["optimizer_steps"] == 1  # 4 micro-batches per rank in one window (4 steps without the flag)
        assert report["provenance"]["gradient_accumulation_steps"] == "launcher flag --gradient_accumulation_steps"
        assert report["explicit"]["optimizer_steps"] == 2  # TrainingArguments(gradient_accumulation_steps=2) won
    assert len(notices) == 1, notices
    assert "gradient_accumulation_steps=2 from TrainingArguments(gradient_accumulation_steps=) overrides 4" in notices[0]


def test_config_show_lists_the_engine_settings_a_script_receives(tmp_path) -> None:
    result = trainkit("config", "--show", "--mixed_precision", "bf16", "--fsdp_sharding_strategy", "2",
                      tmp_path=tmp_path, timeout=60)
    assert result.returncode == 0, explain(result)
    assert "(explicit arguments in the script win over these: explicit > launcher > default)" in result.stdout
    assert "- mixed_precision = bf16  (launcher flag --mixed_precision)" in result.stdout
    assert "- gradient_accumulation_steps = 1  (default)" in result.stdout
    assert "-   sharding_strategy = SHARD_GRAD_OP  (launcher flag --fsdp_sharding_strategy)" in result.stdout
