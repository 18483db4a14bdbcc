"""The Trainer's ``checkpoint-N`` folders in an object store (``TrainingArguments(checkpoint_dir="s3://...")``):
written through the Accelerator's checkpointer into an S3 bucket on a real server (moto's, over HTTP), rotated,
found by ``resume_from_checkpoint=True`` and resumed bitwise; logs and the final model stay in ``output_dir``.
One process, CPU."""

from __future__ import annotations

import pytest
import torch

from tests.object_store import s3, s3_server  # noqa: F401  (fixtures)
from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit import TrainingArguments
from trainkit.engine.checkpoint import CheckpointError

pytestmark = pytest.mark.timeout(300)


def test_trainer_checkpoints_in_an_s3_bucket_rotate_and_resume(s3, tmp_path):
    reference = make_trainer(str(tmp_path / "reference"), save_strategy="no", eval_strategy="no", max_steps=6)
    reference.train()
    bucket_run = f"{s3.url}/run"
    common = dict(eval_strategy="no", max_steps=6, save_total_limit=2, checkpoint_dir=bucket_run)
    stopped = make_trainer(str(tmp_path / "out"), stop_after=4, **common)
    stopped.train()
    committed = sorted({key.split("/")[1] for key in s3.keys("run") if key.endswith("/manifest.json")})
    assert committed == ["checkpoint-3", "checkpoint-4"]  # rotated in the bucket
    assert "run/checkpoint-4/trainer_state.json" in s3.keys("run")
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # nothing local (no tracker file made the folder either)
    resumed = make_trainer(str(tmp_path / "out"), **common)
    assert resumed.train(resume_from_checkpoint=True).global_step == 6
    assert resumed.checkpoint_manager.resumed_from == f"{bucket_run}/checkpoint-4"
    expected, got = final_weights(reference), final_weights(resumed)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_checkpoint_dir_no_backend_handles_fails_at_construction(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint_dir in TrainingArguments: No checkpoint storage handles "
                                              r"nosuch://"):
        TrainingArguments(str(tmp_path), checkpoint_dir="nosuch://bucket/run")
