"""The Trainer's checkpoints in real processes: exact resume under DDP and FSDP2 on 2 ranks, and a rank
SIGKILLed while writing a checkpoint under ``trainkit launch --max_restarts 1``, after which the unchanged
script resumes by itself from the previous complete checkpoint and ends with the uninterrupted weights.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import REPO, run_torchrun, worker_env

WORKER = Path(__file__).with_name("checkpoint_worker.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch of 2 gloo processes running the DDP and FSDP scenarios."""
    out = tmp_path_factory.mktemp("trainer-checkpoints-2proc")
    run_torchrun(WORKER, str(out), "ddp", "fsdp", "fsdp-async", nproc=2, timeout=280)
    return out


def _assert_bitwise_equal(expected: dict, actual: dict) -> None:
    assert expected.keys() == actual.keys()
    different = [key for key in expected if not torch.equal(expected[key], actual[key])]
    assert not different, f"differ: {different}"


@pytest.mark.parametrize("kind", ["ddp", "fsdp", "fsdp-async"])
def test_resume_on_two_ranks_reaches_bitwise_the_uninterrupted_weights(two_ranks, kind):
    expected = load_file(str(two_ranks / f"{kind}-full.safetensors"))
    for stop in (2, 5):
        _assert_bitwise_equal(expected, load_file(str(two_ranks / f"{kind}-resumed-{stop}.safetensors")))
        result = json.loads((two_ranks / f"{kind}-resumed-{stop}.json").read_text())
        assert result["global_step"] == 8 and result["epoch"] == 2.0
        assert result["resumed_from"].endswith(f"checkpoint-{stop}")
    layout = json.loads((two_ranks / f"{kind}-layout.json").read_text())
    assert layout["world_size"] == 2
    assert {"random_states_0.json", "random_states_1.json", "manifest.json", "trainer_state.json"} <= set(layout["checkpoint-3"])


def test_async_fsdp_checkpoints_train_exactly_as_synchronous_ones(two_ranks):
    """Background saves change nothing in the run: the same final weights as with synchronous saves."""
    _assert_bitwise_equal(load_file(str(two_ranks / "fsdp-full.safetensors")),
                          load_file(str(two_ranks / "fsdp-async-full.safetensors")))
    assert json.loads((two_ranks / "fsdp-async-layout.json").read_text())["checkpoint-3"] == \
        json.loads((two_ranks / "fsdp-layout.json").read_text())["checkpoint-3"]


def test_async_full_state_fsdp_checkpoints_resume_bitwise(tmp_path):
    """FSDP2 FULL_STATE_DICT with async_save on 2 gloo processes (CPU): the background writers gather the shards
    and write full files; runs stopped after steps 2 and 5 and resumed from them end with the uninterrupted weights."""
    run_torchrun(WORKER, str(tmp_path), "fsdp-full-async", nproc=2, timeout=280)
    expected = load_file(str(tmp_path / "fsdp-full-async-full.safetensors"))
    for stop in (2, 5):
        _assert_bitwise_equal(expected, load_file(str(tmp_path / f"fsdp-full-async-resumed-{stop}.safetensors")))
        assert json.loads((tmp_path / f"fsdp-full-async-resumed-{stop}.json").read_text())["global_step"] == 8
    layout = json.loads((tmp_path / "fsdp-full-async-layout.json").read_text())["checkpoint-3"]
    assert {"model.safetensors", "optimizer.json", "optimizer.safetensors"} <= set(layout)


def test_ddp_checkpoint_holds_full_weights_once(two_ranks):
    layout = json.loads((two_ranks / "ddp-layout.json").read_text())
    assert [name for name in layout["checkpoint-3"] if "model" in name] == ["model.safetensors"]


def test_fsdp_sharded_checkpoint_holds_dcp_shards_that_merge_weights_turns_into_the_model(two_ranks, tmp_path):
    from trainkit.engine.checkpoint.merged_weights import merge_weights

    layout = json.loads((two_ranks / "fsdp-layout.json").read_text())
    assert layout["distributed_type"].endswith("FSDP")
    # Saved after an evaluation (which leaves FSDP2's root unsharded): still sharded, weights once.
    assert {"pytorch_model_fsdp_0", "optimizer_0"} <= set(layout["checkpoint-3"])
    assert "model.safetensors" not in layout["checkpoint-3"]
    merge_weights(str(two_ranks / "fsdp-full" / "checkpoint-8"), str(tmp_path / "merged"))
    _assert_bitwise_equal(load_file(str(two_ranks / "fsdp-full.safetensors")),
                          load_file(str(tmp_path / "merged" / "model.safetensors")))


def test_a_rank_killed_while_writing_restarts_and_resumes_from_the_previous_checkpoint(tmp_path):
    env = worker_env(TRAINKIT_CONFIG_FILE=str(tmp_path / "no_config.yaml"))
    env.pop("OMP_NUM_THREADS", None)  # the launcher decides threads per process
    command = [sys.executable, "-m", "trainkit.cli.main", "launch", "--num_processes", "2", "--max_restarts", "1",
               str(WORKER), str(tmp_path), "restart"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env, cwd=REPO)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    # The first attempt died inside checkpoint-6's write: the restart found only its staging folder.
    found = json.loads((tmp_path / "restart-found.json").read_text())
    assert found["attempt"] == 1
    assert ".checkpoint-6.staging" in found["entries"] and "checkpoint-6" not in found["entries"]
    assert found["complete"][-1] == "checkpoint-5"
    outcome = json.loads((tmp_path / "restart.json").read_text())
    assert outcome["attempt"] == 1 and outcome["global_step"] == 8
    assert outcome["resumed_from"].endswith("checkpoint-5")
    assert "Restart 1 of this job: resuming automatically from" in result.stderr
    _assert_bitwise_equal(load_file(str(tmp_path / "restart-reference.safetensors")),
                          load_file(str(tmp_path / "restart-resumed.safetensors")))
