"""Where and by whom a checkpoint is written, in real processes (2 gloo processes, CPU): ``save_state`` on the main
process only (saves alone, without a hang; a sharded state refused by name), and each process's own folder (as
Accelerate's per-process ``save_state(folder)``; each node's own disk) with FSDP2 shards: exact resume on the same
layout, a clear refusal on another.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.distributed import ENGINE_WORKERS, run_python, run_torchrun
from tests.engine.checkpoint.test_checkpoint_processes import WORKER, assert_bitwise_equal, assert_order_continues

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_save_state_on_the_main_process_only_saves_alone_or_refuses_a_sharded_state(tmp_path):
    worker = ENGINE_WORKERS / "main_process_saves.py"
    ddp = run_torchrun(worker, tmp_path, nproc=2)
    result = json.loads((tmp_path / "main_saves.json").read_text())
    # Followed by wait_for_everyone() or by training on: the other process, in the barrier or in the step's
    # gradient all-reduce, declines at once (no wait for ALONE_AFTER_S).
    assert ddp.stderr.count("process 1 did not call it (they went on to another collective") == 2, ddp.stderr[-3000:]
    assert "had not called it after" not in ddp.stderr
    assert "waitForInput" not in ddp.stderr  # the watcher polls the store quietly (no timed-out waits logged)
    for name in ("then_barrier", "then_training"):
        assert "random_states_0.json" in result["contents"][name] and "random_states_1.json" not in result["contents"][name]
        assert result["restored"][name]
    assert {"random_states_0.json", "random_states_1.json"} <= set(result["contents"]["everyone"])
    assert "rank 1 takes the random states of rank 0" in ddp.stderr  # loading a main-process-only checkpoint

    run_torchrun(worker, tmp_path, "--fsdp", nproc=2)
    rank0, rank1 = (json.loads((tmp_path / f"fsdp_rank{r}.json").read_text()) for r in range(2))
    assert rank0["outcome"].startswith("save_state needs every process for this state (model 0 is sharded")
    assert "process 1 did not call it" in rank0["outcome"] and "nothing was saved" in rank0["outcome"]
    assert rank1["outcome"] == "no error" and not rank0["exists"]


def test_each_process_own_folder_resumes_sharded_state_exactly_and_refuses_another_layout(tmp_path):
    fsdp = ("--fsdp", "SHARDED_STATE_DICT", "--fp16")
    run_torchrun(WORKER, "--out", tmp_path, "--name", "reference", "--project", tmp_path / "reference",
                 "--save-at", "4", "7", *fsdp, nproc=2)
    own = tmp_path / "own"
    run_torchrun(WORKER, "--out", tmp_path, "--name", "saved", "--project", own, "--save-at", "4", *fsdp,
                 "--per-rank-project", nproc=2)
    for rank in (0, 1):
        folder = own / f"rank{rank}" / "checkpoints" / "checkpoint_0"
        assert (folder / f"random_states_{rank}.json").is_file() and not (folder / f"random_states_{1 - rank}.json").exists()
        assert (folder / "pytorch_model_fsdp_0" / ".metadata").is_file() and (folder / "manifest.json").is_file()
    run_torchrun(WORKER, "--out", tmp_path, "--name", "resumed", "--project", own, *fsdp, "--per-rank-project",
                 "--resume", "latest", "--seed", "5", nproc=2)
    assert_bitwise_equal(load_file(str(tmp_path / "reference.safetensors")), load_file(str(tmp_path / "resumed.safetensors")))
    assert_order_continues(json.loads((tmp_path / "reference.json").read_text()),
                           json.loads((tmp_path / "resumed.json").read_text()), from_step=4)
    with pytest.raises(AssertionError) as refused:  # one process cannot have the other node's shards
        run_python(WORKER, "--out", tmp_path, "--name", "one", "--project", tmp_path / "one", *fsdp,
                   "--per-rank-batch", "8", "--resume", own / "rank0" / "checkpoints" / "checkpoint_0")
    message = str(refused.value)
    assert "is one node's part of a checkpoint that each node wrote into its own folder (processes 0, 1)" in message
    assert "the other processes' shards of pytorch_model_fsdp_0/" in message and "nothing was loaded" in message
    assert not Path(tmp_path / "one.json").exists()
