"""The issue's DeepSpeed YAML (a JSON file plus zero3_init_flag, as `accelerate config` writes it) launches.

CPU, 2 gloo ranks (every GPU hidden), one launch of a stand-in Accelerator script.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.cli_helpers import SCRIPTS, explain, reports, trainkit

pytestmark = pytest.mark.multiprocess


def test_config_file_and_zero3_init_flag_train_on_two_ranks(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3},
                                                  "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}))
    (tmp_path / "ds.yaml").write_text(f"distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 2\n"
                                      f"deepspeed_config:\n  deepspeed_config_file: {tmp_path / 'ds.json'}\n"
                                      "  zero3_init_flag: false\n")
    result = trainkit("launch", "--config_file", tmp_path / "ds.yaml", SCRIPTS / "reader_train.py", tmp_path=tmp_path,
                      timeout=240)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["distributed_type"] == "DEEPSPEED" and report["mixed_precision"] == "bf16"
        assert report["loss_finite"]
