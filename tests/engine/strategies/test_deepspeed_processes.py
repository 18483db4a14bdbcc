"""DeepSpeed configs in real processes (CPU, 2 gloo ranks): ZeRO 0-3 and offload against DDP, what each rank
holds, the optimizer/scheduler blocks, TrainingArguments(deepspeed=...), and the launch YAML and flags.

One torchrun job runs every engine variant (tests/engine/workers/deepspeed_runs.py); two `trainkit launch`
runs check the entry points.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_helpers import SCRIPTS, explain, reports, trainkit
from tests.distributed import ENGINE_WORKERS, run_torchrun

pytestmark = pytest.mark.multiprocess
WORKER = ENGINE_WORKERS / "deepspeed_runs.py"
STAGES = ["zero0", "zero1", "zero2", "zero3", "zero3_offload"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("deepspeed")
    run_torchrun(WORKER, out, nproc=2, timeout=300)
    return json.loads((out / "deepspeed.json").read_text())


@pytest.mark.parametrize("name", STAGES)
def test_each_stage_trains_like_ddp(results, name):
    assert results[name]["distributed_type"] == "DEEPSPEED"
    assert results[name]["loss_diff"] <= 1e-4, results[name]


def test_each_stage_shards_what_zero_shards(results):
    full = results["ddp"]["held"]
    held = {name: results[name]["held"] for name in STAGES}
    assert held["zero0"] == full
    # stage 1: optimizer state ~1/2 per rank (ZeroRedundancyOptimizer), parameters and gradients whole
    assert held["zero1"]["params"] == full["params"] and held["zero1"]["grads"] == full["grads"]
    assert 0.45 <= held["zero1"]["optimizer"] / full["optimizer"] <= 0.55
    # stages 2 and 3 on FSDP2: gradients and optimizer state halved; parameters too (FSDP2 keeps them
    # sharded between steps at both), which is at least what ZeRO-2 shards
    for name in ("zero2", "zero3", "zero3_offload"):
        for kind in ("params", "grads", "optimizer"):
            assert 0.45 <= held[name][kind] / full[kind] <= 0.55, (name, kind, held[name], full)
    assert results["zero1"]["strategy"] == "DDPStrategy" and results["zero3"]["strategy"] == "FSDPStrategy"


def test_optimizer_and_scheduler_blocks_build_torch_objects(results):
    blocks = results["blocks"]
    assert blocks["optimizer"] == "AdamW"
    lrs = blocks["lrs"]
    assert lrs[1] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(0.0)  # warm-up to lr, then linear decay
    assert lrs[0] < lrs[1] and all(a >= b for a, b in zip(lrs[1:], lrs[2:]))


def test_checkpoints_of_zero1_and_zero3_resume_exactly(results):
    assert results["checkpoint"] == {"1": 0.0, "3": 0.0}


def test_training_arguments_deepspeed_gives_the_same_run(results):
    trainer = results["trainer"]
    assert trainer["deepspeed_type"] == "DEEPSPEED" and trainer["plain_type"] == "MULTI_CPU"
    assert len(trainer["deepspeed"]) == len(trainer["plain"]) == 10
    assert max(abs(a - b) for a, b in zip(trainer["deepspeed"], trainer["plain"])) <= 1e-4


def test_accelerate_deepspeed_yaml_runs_on_fsdp2(tmp_path):
    config_file = tmp_path / "ds.yaml"
    config_file.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"
                           "num_processes: 2\nuse_cpu: true\ndeepspeed_config:\n  zero_stage: 3\n"
                           "  offload_optimizer_device: cpu\n  offload_param_device: cpu\n"
                           "  gradient_accumulation_steps: 2\n  zero3_save_16bit_model: true\n")
    result = trainkit("launch", "--config_file", config_file, SCRIPTS / "accelerator_worker.py", tmp_path=tmp_path,
                      timeout=180)
    assert result.returncode == 0, explain(result)
    for report in reports(result.stdout).values():
        assert report["distributed_type"] == "DEEPSPEED" and report["sharding_strategy"] == "FULL_SHARD"
        assert report["offload_params"] is True and report["mixed_precision"] == "bf16"
        assert report["gradient_accumulation_steps"] == 2


def test_deepspeed_flags_zero1_shards_the_optimizer(tmp_path):
    result = trainkit("launch", "--num_processes", "2", "--cpu", "--zero_stage", "1", "--gradient_clipping", "1.0",
                      SCRIPTS / "accelerator_worker.py", tmp_path=tmp_path, timeout=180)
    assert result.returncode == 0, explain(result)
    found = reports(result.stdout)
    assert sorted(found) == [0, 1]
    for report in found.values():
        assert report["distributed_type"] == "DEEPSPEED" and report["optimizer"] == "ShardedStateOptimizer"
