"""Asynchronous checkpoints on 2 gloo processes (CPU, DDP; FSDP2 FULL_STATE_DICT for the background gather): kills
at several points of a background write, a preemption during one, a disk-full error, and exact resume through all
of it.

One chain of launches shares one project folder: each run resumes from the newest complete checkpoint, saves
after every optimizer step in the background, and is stopped by the next fault; the last run resumes with
synchronous saves (the formats are the same) and must end bitwise where an uninterrupted run ends, having
consumed the same samples step by step. The writer is a thread of each rank, so killing "the writer" kills
its process: the points below are where in the background write that happens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import ENGINE_WORKERS, run_torchrun
from tests.object_store import s3, s3_server  # noqa: F401  (fixtures)
from tests.engine.checkpoint.test_checkpoint_processes import WORKER, _record, _weights, assert_bitwise_equal, assert_order_continues
from trainkit.engine.checkpoint import is_complete, latest_complete_checkpoint

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STEPS = 9
EVERY_STEP = ("--save-at", *map(str, range(1, STEPS + 1)), "--fp16")
PREEMPTED = 75


def _run(tmp_path: Path, name: str, project: Path | str, *extra: str, check: bool = True):
    return run_torchrun(WORKER, "--out", tmp_path, "--name", name, "--project", project, *EVERY_STEP, *extra,
                        nproc=2, check=check)


def _saved_step(folder: str) -> int:
    """The optimizer step a checkpoint was taken after (the worker registers its step counter)."""
    return json.loads((Path(folder) / "custom_checkpoint_0.json").read_text())["state"]["optimizer_steps"]


def test_kills_and_a_preemption_during_background_writes_resume_bitwise(tmp_path):
    _run(tmp_path, "reference", tmp_path / "reference")
    reference = _record(tmp_path, "reference")
    project = tmp_path / "chain"
    checkpoints = project / "checkpoints"
    # (fault, the newest complete checkpoint's step afterwards); each run resumes from the previous one's.
    chain = [("0:2:files", 1), ("1:3:hash", 2), ("0:4:rename", 3), ("1:5:loop", 4)]
    for index, (fault, complete_step) in enumerate(chain):
        name = f"killed{index}"
        resume = ("--resume", "latest", "--seed", str(10 + index)) if index else ()
        result = _run(tmp_path, name, project, "--async-save", "--fault", fault, *resume, check=False)
        assert result.returncode != 0 and "SIGKILL" in result.stderr, result.stderr[-3000:]
        latest = latest_complete_checkpoint(str(checkpoints))
        assert latest is not None and _saved_step(latest) == complete_step, (fault, latest)
        # Nothing half there: every visible folder is complete; the interrupted write is a hidden staging folder.
        visible = [p for p in checkpoints.iterdir() if not p.name.startswith(".")]
        assert all(is_complete(str(p)) for p in visible), fault
        assert any(p.name.startswith(".") and p.name.endswith(".staging") for p in checkpoints.iterdir()), fault
        if index:
            assert "Skipping incomplete checkpoints" in result.stderr

    # SIGTERM while the step-6 checkpoint is written in the background: that save is finished, then the
    # preemption checkpoint is written (at the step where the ranks agree to stop: 7, or 8 when the signal
    # came after step 7's check), and the run exits with code 75.
    preempted = _run(tmp_path, "preempted", project, "--async-save", "--check-preemption", "--fault", "0:6:sigterm",
                     "--resume", "latest", "--seed", "20", check=False)
    # torchrun reports the first rank's exit code 75 (then stops the other, already exiting, rank).
    assert f"failed (exitcode: {PREEMPTED})" in preempted.stderr, preempted.stderr[-3000:]
    assert "Preemption: saved" in preempted.stderr
    assert _record_missing(tmp_path, "preempted")
    visible = [p for p in checkpoints.iterdir() if not p.name.startswith(".")]
    assert all(is_complete(str(p)) for p in visible)
    steps = sorted(_saved_step(str(p)) for p in visible)
    stopped_at = _saved_step(latest_complete_checkpoint(str(checkpoints)))
    assert 6 in steps and stopped_at in (7, 8) and steps.count(stopped_at) == 2, steps  # regular + preemption

    # The rerun resumes (synchronous saves now: the files are the same format) and ends bitwise as the reference.
    _run(tmp_path, "resumed", project, "--resume", "latest", "--seed", "30")
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    assert_order_continues(reference, _record(tmp_path, "resumed"), from_step=stopped_at)


def _record_missing(out: Path, name: str) -> bool:
    """A run stopped by preemption writes no final record (it exits inside the loop)."""
    return not (out / f"{name}.json").exists()


def test_a_disk_full_error_in_the_writer_stops_the_loop_with_path_and_cause(tmp_path):
    project = tmp_path / "full"
    result = _run(tmp_path, "full", project, "--async-save", "--fault", "0:3:disk-full", check=False)
    assert result.returncode != 0
    assert "CheckpointError: The background write of checkpoint" in result.stderr
    assert "checkpoint_2" in result.stderr and "No space left on device" in result.stderr
    checkpoints = project / "checkpoints"
    assert _saved_step(latest_complete_checkpoint(str(checkpoints))) == 2
    assert not (checkpoints / "checkpoint_2").exists() and not (checkpoints / ".checkpoint_2.staging").exists()


def test_a_full_state_dict_save_gathered_by_the_writer_is_byte_identical_to_a_synchronous_one(tmp_path):
    """FSDP2 FULL_STATE_DICT on 2 gloo processes (CPU): the asynchronous save stages each rank's shards and its
    writer gathers them onto rank 0 (on its own group, while the loop trains); the files equal the synchronous ones."""
    run_torchrun(ENGINE_WORKERS / "full_state_async.py", tmp_path, nproc=2)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["checksums"]["sync"] == result["checksums"]["async"]
    assert {"model.safetensors", "optimizer.safetensors"} <= set(result["checksums"]["async"])
    # Each rank staged its own shards (a gather in the loop would leave rank 1 nothing to stage).
    assert all(staged > 0 for staged in result["staged_bytes"]), result["staged_bytes"]


def test_a_rank_killed_while_the_writers_gather_a_full_state_checkpoint_resumes_bitwise(tmp_path):
    """FSDP2 FULL_STATE_DICT, async saves, 2 gloo processes (CPU): rank 1 is SIGKILLed while the background writers
    gather the step-3 checkpoint onto rank 0; the step-2 one stays the newest complete, and a resumed run ends
    bitwise as an uninterrupted one."""
    full = ("--fsdp", "FULL_STATE_DICT")
    _run(tmp_path, "reference", tmp_path / "reference", *full)
    project = tmp_path / "gather"
    killed = _run(tmp_path, "killed", project, *full, "--async-save", "--fault", "1:3:gather", check=False)
    assert killed.returncode != 0 and "SIGKILL while the writers gather" in killed.stderr, killed.stderr[-3000:]
    checkpoints = project / "checkpoints"
    assert _saved_step(latest_complete_checkpoint(str(checkpoints))) == 2
    assert all(is_complete(str(p)) for p in checkpoints.iterdir() if not p.name.startswith("."))
    _run(tmp_path, "resumed", project, *full, "--async-save", "--resume", "latest", "--seed", "7")
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    assert_order_continues(_record(tmp_path, "reference"), _record(tmp_path, "resumed"), from_step=2)


# -- the same faults on the other backends: an object store (S3, moto's server over HTTP) and each node's own folder
def _newest_saved_step(storage, checkpoints: str) -> int | None:
    """The optimizer step of the newest complete checkpoint under ``checkpoints`` (read through its storage)."""
    latest = storage.latest(checkpoints, "checkpoint_")
    if latest is None:
        return None
    document = storage.read_bytes(storage.join(storage.files_at(latest), "custom_checkpoint_0.json"))
    return json.loads(document)["state"]["optimizer_steps"]


@pytest.mark.parametrize("backend", ["s3", "per_node"])
def test_kills_during_uploads_and_per_node_writes_resume_bitwise(tmp_path, backend, request):
    """2 gloo processes (CPU), async saves after every step. A rank is SIGKILLed after uploading (or writing into
    its node's folder) a tensor file, then, in the next run, with every file written and checked but before the
    commit (the manifest upload; on a disk, the rename). Each time the previous checkpoint stays the newest valid
    one everywhere, and the run resumed from it ends bitwise as the uninterrupted one."""
    from tests.distributed import worker_env
    from trainkit.engine.checkpoint.storage import SharedFolderStorage
    from trainkit.engine.checkpoint.storage.object_store import ObjectStoreStorage

    if backend == "s3":  # rank 0 uploads the shared files and the manifest
        bucket = request.getfixturevalue("s3")
        env, project, layout, victim = worker_env(**bucket.env), f"{bucket.url}/chain", (), 0
        places = [(ObjectStoreStorage(), f"{project}/checkpoints")]
    else:  # rank 1 writes and commits its own folder (the other node's)
        env, project, layout, victim = None, str(tmp_path / "chain"), ("--per-rank-project",), 1
        places = [(SharedFolderStorage(), str(tmp_path / "chain" / f"rank{rank}" / "checkpoints")) for rank in (0, 1)]

    def run(name, *extra, check=True):
        return run_torchrun(WORKER, "--out", tmp_path, "--name", name, "--project", project, *EVERY_STEP, *layout,
                            *extra, nproc=2, check=check, env=env)

    _run(tmp_path, "reference", tmp_path / "reference")
    for index, (fault, complete_step) in enumerate([(f"{victim}:2:files", 1), (f"{victim}:3:rename", 2)]):
        resume = ("--resume", "latest", "--seed", str(10 + index)) if index else ()
        killed = run(f"killed{index}", "--async-save", "--fault", fault, *resume, check=False)
        assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
        # The victim's place holds the previous checkpoint as its newest (the other node may have committed its
        # part of the interrupted one: resuming takes the newest every node holds).
        steps = [_newest_saved_step(storage, folder) for storage, folder in places]
        assert steps[victim if len(places) > 1 else 0] == complete_step and min(steps) == complete_step, steps
    run("resumed", "--resume", "latest", "--seed", "30")
    assert_bitwise_equal(_weights(tmp_path, "reference"), _weights(tmp_path, "resumed"))
    assert_order_continues(_record(tmp_path, "reference"), _record(tmp_path, "resumed"), from_step=2)
