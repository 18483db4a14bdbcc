"""``save_state`` / ``load_state`` anywhere, as Accelerate loads (one process, CPU): an S3 bucket on a real server
(moto's, over HTTP), with automatic naming, rotation and the fallback past a damaged checkpoint; a URL no backend
handles refused by name (never a local folder ``s3:``...); a store that refuses writes raising in the loop with
nothing lost; and loading into fewer prepared objects than were saved.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn

from tests.object_store import s3, s3_server  # noqa: F401  (fixtures)
from trainkit import Accelerator
from trainkit.engine.checkpoint import CheckpointError, CheckpointMismatchError
from trainkit.engine.checkpoint.storage.object_store import ObjectStoreStorage
from trainkit.utils.dataclasses import ProjectConfiguration


def _training(project_dir=None, **project):
    torch.manual_seed(0)
    config = ProjectConfiguration(project_dir=project_dir, **project) if project_dir or project else None
    accelerator = Accelerator(cpu=True, project_config=config)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _step(accelerator, model, optimizer, scheduler):
    accelerator.backward(model(torch.randn(3, 4)).pow(2).mean())
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def test_save_state_and_load_state_in_an_s3_bucket(s3):
    accelerator, model, optimizer, scheduler = _training()
    _step(accelerator, model, optimizer, scheduler)
    url = f"{s3.url}/run/ckpt"
    assert accelerator.save_state(url) == url
    assert "run/ckpt/manifest.json" in s3.keys("run") and "run/ckpt/model.safetensors" in s3.keys("run")
    saved, lr = _weights(model), scheduler.get_last_lr()
    _step(accelerator, model, optimizer, scheduler)
    accelerator.save_state(url)  # saved again: replaced whole once the new one is committed
    _step(accelerator, model, optimizer, scheduler)
    fresh, fresh_model, _, fresh_scheduler = _training()
    fresh.load_state(url)
    assert not all(torch.equal(a, b) for a, b in zip(saved, _weights(fresh_model)))  # the second save, not the first
    accelerator.load_state(url)
    assert all(torch.equal(a, b) for a, b in zip(_weights(fresh_model), _weights(model)))
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr() != lr
    # The replacement's files are in the sub-prefix its manifest names; the first save's files are gone.
    root = accelerator.checkpointer.storage_for(url).read_manifest(url)["root"]
    assert {key.split("/")[2] for key in s3.keys("run")} == {"manifest.json", root}


def test_automatic_naming_in_a_bucket_rotates_and_resumes_past_a_damaged_checkpoint(s3, caplog):
    project = f"{s3.url}/project"
    accelerator, model, optimizer, scheduler = _training(project, automatic_checkpoint_naming=True, total_limit=2)
    kept = []
    for _ in range(3):
        _step(accelerator, model, optimizer, scheduler)
        kept.append(_weights(model))
        accelerator.save_state()
    names = sorted({key.split("/")[2] for key in s3.keys("project/checkpoints")})
    assert names == ["checkpoint_1", "checkpoint_2"]  # total_limit=2: checkpoint_0 rotated away
    # The newest is damaged in the store (same size, other bytes): load_state() resumes from the one before.
    storage = ObjectStoreStorage()
    damaged = f"{project}/checkpoints/checkpoint_2/model.safetensors"
    data = storage.read_bytes(damaged)
    storage.write_bytes(damaged, data[:-4] + bytes(4))
    resumed, resumed_model, _, _ = _training(project, automatic_checkpoint_naming=True, total_limit=2)
    with caplog.at_level(logging.WARNING):
        resumed.load_state()
    assert "Skipping" in caplog.text and "checkpoint_2" in caplog.text and "wrong SHA-256" in caplog.text
    assert resumed.loaded_checkpoint.endswith("checkpoint_1")
    assert all(torch.equal(a, b) for a, b in zip(kept[1], _weights(resumed_model)))
    resumed.save_state()  # numbering goes on after the loaded one: the damaged checkpoint_2 is set aside
    keys = s3.keys("project/checkpoints")
    assert any(key.startswith("project/checkpoints/checkpoint_2.damaged-") for key in keys)
    assert resumed.checkpointer.is_checkpoint(f"{project}/checkpoints/checkpoint_2")


def test_a_url_no_backend_handles_is_refused_by_name_and_never_becomes_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    accelerator, *_ = _training()
    with pytest.raises(CheckpointError, match=r"No checkpoint storage handles nosuch://.*nosuch://bucket/run"):
        accelerator.save_state("nosuch://bucket/run")
    with pytest.raises(CheckpointError, match="No checkpoint storage handles nosuch://"):
        accelerator.load_state("nosuch://bucket/run")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("async_save", [False, True])
def test_a_store_that_refuses_writes_fails_in_the_loop_with_nothing_lost(s3, async_save):
    project = f"{s3.url}/refused"
    accelerator, model, optimizer, scheduler = _training(project, automatic_checkpoint_naming=True,
                                                         async_save=async_save)
    _step(accelerator, model, optimizer, scheduler)
    first = accelerator.save_state()
    accelerator.end_training()
    s3.deny_writes("refused/checkpoints/checkpoint_1/")  # permissions, or a quota, from now on
    _step(accelerator, model, optimizer, scheduler)
    with pytest.raises(CheckpointError) as raised:
        accelerator.save_state()
        _step(accelerator, model, optimizer, scheduler)  # asynchronous: raised at the next backward
    message = str(raised.value)
    assert "checkpoint_1" in message and ("Forbidden" in message or "PermissionError" in message), message
    assert [key.split("/")[2] for key in s3.keys("refused/checkpoints") if key.endswith("manifest.json")] \
        == ["checkpoint_0"]
    assert accelerator.checkpointer.is_checkpoint(first)
    accelerator.load_state(first)  # the previous checkpoint still loads


def test_load_state_into_fewer_prepared_objects_loads_what_is_prepared_and_says_what_not(tmp_path, caplog):
    accelerator, model, optimizer, scheduler = _training()
    _step(accelerator, model, optimizer, scheduler)
    folder = accelerator.save_state(str(tmp_path / "full"))
    evaluation = Accelerator(cpu=True)
    only_model = evaluation.prepare(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    with caplog.at_level(logging.WARNING):
        evaluation.load_state(folder)
    assert all(torch.equal(a, b) for a, b in zip(_weights(model), _weights(only_model)))
    lines = [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()]
    assert len(lines) == 1 and "optimizer 0, scheduler 0" in lines[0] and "require_all_objects=True" in lines[0]
    before = _weights(only_model)
    with pytest.raises(CheckpointMismatchError, match=r"number of optimizers \(checkpoint 1, prepared now 0\)"):
        evaluation.load_state(folder, require_all_objects=True)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(only_model)))
    # More prepared than saved is never loosened: something would be left unloaded without a word.
    more, *_ = _training()
    more.register_for_checkpointing(torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([nn.Parameter(torch.ones(1))]),
                                                                      lambda step: 1.0))
    with pytest.raises(CheckpointMismatchError, match="registered objects"):
        more.load_state(folder)


def test_keywords_trainkit_does_not_apply_are_named(tmp_path, caplog):
    accelerator, *_ = _training()
    with caplog.at_level(logging.WARNING):
        folder = accelerator.save_state(str(tmp_path / "c"), exclude_frozen_parameters=True)
        accelerator.load_state(folder, strict=False)
    text = caplog.text
    assert "save_state(exclude_frozen_parameters=): not applied by trainkit" in text
    assert "load_state(strict=): not applied by trainkit" in text
