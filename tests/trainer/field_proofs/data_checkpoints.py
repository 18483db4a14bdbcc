"""Proofs of the fields that decide what a run reads and writes: data loading and sampling, checkpoints, the
best model and resuming (CPU, one process)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.trainer.checkpoint_workload import RegressionData, DropoutRegressor, final_weights, make_trainer
from tests.trainer.helpers import EchoModel
from trainkit import Trainer, TrainerCallback, TrainingArguments

from .common import calls_of, logged, quick, record_forwards, training_samples

HERE = Path(__file__).resolve().parent


# --- data loading ---------------------------------------------------------------------------------------------
def p_dataloader_drop_last(tmp_path):
    trainer = quick(tmp_path, max_steps=-1, num_train_epochs=1, per_device_train_batch_size=5,
                    dataloader_drop_last=True)
    seen = record_forwards(trainer)
    trainer.train()
    assert training_samples(seen) == 40  # 8 batches of 5; the last 4 samples are dropped (default: 44)


class FromWorker(RegressionData):
    """Each sample says which process read it (the DataLoader's worker, or the main process)."""

    def __getitem__(self, index):
        return {**super().__getitem__(index), "pid": torch.tensor(os.getpid())}


class RemembersPids(DropoutRegressor):
    def __init__(self):
        super().__init__()
        self.pids: list[set[int]] = []

    def forward(self, x, labels=None, pid=None):
        self.pids.append(set(pid.tolist()))
        return super().forward(x, labels)


def pids_per_epoch(tmp_path, **fields) -> list[set[int]]:
    """Two epochs of 4 batches: the processes that read each epoch's samples."""
    model = RemembersPids()
    args = dict(max_steps=-1, num_train_epochs=2, per_device_train_batch_size=2, gradient_accumulation_steps=1)
    trainer = make_trainer(str(tmp_path / "out"), model_init=lambda: model, save_strategy="no", eval_strategy="no",
                           **{**args, **fields})
    trainer.train_dataset = FromWorker(8)
    trainer.train()
    return [set().union(*model.pids[:4]), set().union(*model.pids[4:])]


def p_dataloader_num_workers(tmp_path):
    epochs = pids_per_epoch(tmp_path, dataloader_num_workers=1)
    assert os.getpid() not in set().union(*epochs)  # read in a worker process (default: in this one)


def p_dataloader_persistent_workers(tmp_path):
    first, second = pids_per_epoch(tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True)
    assert first == second and os.getpid() not in first  # one worker for both epochs (default: one per epoch)


def loader_calls(tmp_path, monkeypatch, **fields) -> list[dict]:
    """The keyword arguments of every torch DataLoader built for the training data."""
    calls = calls_of(monkeypatch, torch.utils.data.DataLoader, "__init__")
    quick(tmp_path, dataloader_num_workers=1, **fields).get_train_dataloader()
    return [kwargs for _, kwargs in calls]


def p_dataloader_prefetch_factor(tmp_path, monkeypatch):
    calls = loader_calls(tmp_path, monkeypatch, dataloader_prefetch_factor=3)
    assert calls and {call.get("prefetch_factor") for call in calls} == {3}


def p_dataloader_multiprocessing_context(tmp_path, monkeypatch):
    calls = loader_calls(tmp_path, monkeypatch, dataloader_multiprocessing_context="spawn")
    contexts = {getattr(call.get("multiprocessing_context"), "_name", call.get("multiprocessing_context")) for call in calls}
    assert calls and contexts == {"spawn"}, contexts  # the name, or the context torch made of it


def p_dataloader_in_order(tmp_path, monkeypatch):
    calls = loader_calls(tmp_path, monkeypatch, dataloader_in_order=False)
    assert calls and {call.get("in_order") for call in calls} == {False}


def p_dataloader_pin_memory(tmp_path, monkeypatch):
    """On a GPU machine torch pins the batches' host memory unless told not to (on CPU it never does)."""
    calls = calls_of(monkeypatch, torch.utils.data.DataLoader, "__init__")
    quick(tmp_path, dataloader_pin_memory=False).get_train_dataloader()
    assert calls and {kwargs.get("pin_memory") for _, kwargs in calls} == {False}


def p_use_cpu(tmp_path):
    """On a GPU machine, use_cpu=True runs the model on the CPU (the default picks the GPU)."""
    devices: set[str] = set()

    def recording_model():
        model = DropoutRegressor()
        model.layers[0].register_forward_hook(lambda m, inputs, output: devices.add(inputs[0].device.type))
        return model

    quick(tmp_path, model_init=recording_model, use_cpu=True, max_steps=1).train()
    assert devices == {"cpu"}


class TakesAnything(DropoutRegressor):
    def __init__(self):
        super().__init__()
        self.keys: set[str] = set()

    def forward(self, x, labels=None, **extra):
        self.keys |= set(extra)
        return super().forward(x, labels)


def p_remove_unused_columns(tmp_path):
    """A datasets.Dataset column the forward does not name reaches it (by default the column is dropped)."""
    from datasets import Dataset

    data = RegressionData()
    columns = {"x": data.x.tolist(), "labels": data.y.tolist(), "note": list(range(len(data)))}
    model = TakesAnything()
    trainer = quick(tmp_path, model_init=lambda: model, remove_unused_columns=False, max_steps=1)
    trainer.train_dataset = Dataset.from_dict(columns).with_format("torch")
    trainer.train()
    assert model.keys - {"num_items_in_batch"} == {"note"}  # a **kwargs forward also gets the count, as in transformers


def p_train_sampling_strategy(tmp_path):
    trainer = quick(tmp_path, train_sampling_strategy="sequential", max_steps=1)
    seen = record_forwards(trainer)
    trainer.train()
    assert torch.equal(torch.cat([f.inputs for f in seen]), RegressionData().x[:6])  # samples 0-5 in order


def variable_lengths(length_column: str | None = None):
    """64 token sequences of lengths 1..64 in a fixed shuffled order (a datasets.Dataset); ``length_column`` holds
    65 - length, the reverse of the true lengths."""
    from datasets import Dataset

    lengths = (torch.randperm(64, generator=torch.Generator().manual_seed(0)) + 1).tolist()
    columns = {"input_ids": [[1] * n for n in lengths]}
    if length_column:
        columns[length_column] = [65 - n for n in lengths]
    return Dataset.from_dict(columns)


def pad(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    for row, feature in enumerate(features):
        ids[row, : len(feature["input_ids"])] = torch.tensor(feature["input_ids"])
    return {"input_ids": ids, "x": (ids != 0).sum(1, keepdim=True).float()}


def first_batch_lengths(tmp_path, dataset, **fields) -> list[int]:
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=8, remove_unused_columns=False,
                             report_to="none", disable_tqdm=True, **fields)
    loader = Trainer(model=EchoModel(), args=args, train_dataset=dataset, data_collator=pad).get_train_dataloader()
    return [int(n) for n in next(iter(loader))["x"].squeeze(-1)]


def p_group_by_length(tmp_path):
    """transformers' length-grouped order: the longest sample's batch first, sorted by length (a random order is
    sorted with probability 1/8!)."""
    lengths = first_batch_lengths(tmp_path, variable_lengths(), group_by_length=True)
    assert lengths[0] == 64 and lengths == sorted(lengths, reverse=True)


def p_length_column_name(tmp_path):
    """The lengths come from the named column (here the reverse of the true ones): the shortest sample leads."""
    lengths = first_batch_lengths(tmp_path, variable_lengths("n"), train_sampling_strategy="group_by_length",
                                  length_column_name="n")
    assert lengths[0] == 1 and lengths == sorted(lengths)


# --- checkpoints -----------------------------------------------------------------------------------------------------
def checkpoints(folder: Path) -> list[str]:
    return sorted((name for name in os.listdir(folder) if name.startswith("checkpoint-")),
                  key=lambda name: int(name.split("-")[1]))


def p_output_dir(tmp_path):
    trainer = quick(tmp_path / "chosen")
    trainer.save_model()
    assert (tmp_path / "chosen" / "out" / "model.safetensors").exists()  # default: ./trainer_output


def p_save_strategy(tmp_path):
    quick(tmp_path, max_steps=-1, num_train_epochs=2, save_strategy="epoch").train()
    assert checkpoints(tmp_path / "out") == ["checkpoint-8", "checkpoint-16"]  # the workload's steps: every step


def p_save_steps(tmp_path):
    quick(tmp_path, max_steps=5, save_strategy="steps", save_steps=2).train()
    assert checkpoints(tmp_path / "out") == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]  # and the last step


def p_save_total_limit(tmp_path):
    quick(tmp_path, max_steps=4, save_strategy="steps", save_total_limit=2).train()
    assert checkpoints(tmp_path / "out") == ["checkpoint-3", "checkpoint-4"]  # the workload saves every step


def p_save_only_model(tmp_path):
    quick(tmp_path / "full", max_steps=1, save_strategy="steps").train()
    quick(tmp_path / "only", max_steps=1, save_strategy="steps", save_only_model=True).train()
    full = set(os.listdir(tmp_path / "full" / "out" / "checkpoint-1"))
    only = set(os.listdir(tmp_path / "only" / "out" / "checkpoint-1"))
    assert "model.safetensors" in only and "optimizer.safetensors" in full - only


def commit_threads(monkeypatch) -> list[tuple[str, str]]:
    """(thread name, folder) of every os.rename that makes a checkpoint-N folder visible (the atomic commit)."""
    seen: list[tuple[str, str]] = []
    rename = os.rename

    def recording(source, destination, *args, **kwargs):
        if os.path.basename(os.fspath(destination)).startswith("checkpoint-"):
            seen.append((threading.current_thread().name, os.path.basename(os.fspath(destination))))
        return rename(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "rename", recording)
    return seen


def p_async_save(tmp_path, monkeypatch):
    commits = commit_threads(monkeypatch)
    quick(tmp_path, max_steps=2, save_strategy="steps", async_save=True).train()
    main = threading.main_thread().name
    assert [folder for _, folder in commits] == ["checkpoint-1", "checkpoint-2"]
    assert all(thread != main for thread, _ in commits), commits  # written in the background (default: here)


def p_checkpoint_dir(tmp_path):
    """checkpoint-N goes to checkpoint_dir (here an in-memory object store, fsspec's memory://), not output_dir."""
    import uuid

    from trainkit.engine.checkpoint.storage.object_store import ObjectStoreStorage

    store = f"memory://proof-{uuid.uuid4().hex[:8]}/run"
    quick(tmp_path, max_steps=2, save_strategy="steps", checkpoint_dir=store).train()
    assert [entry.number for entry in ObjectStoreStorage().list(store, "checkpoint-") if entry.complete] == [1, 2]
    assert not (tmp_path / "out").exists() or not checkpoints(tmp_path / "out")  # nothing else writes there either


def p_async_save_when_busy(tmp_path, monkeypatch):
    """A background write slowed to 0.5 s: with 'skip', the saves that find it still running are skipped."""
    import time

    rename = os.rename

    def slow_in_background(source, destination, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.5)
        return rename(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "rename", slow_in_background)
    quick(tmp_path, max_steps=4, save_strategy="steps", async_save=True, async_save_when_busy="skip").train()
    saved = checkpoints(tmp_path / "out")
    assert saved[0] == "checkpoint-1" and len(saved) < 4, saved  # 'wait' (default) writes all four


def p_enable_jit_checkpoint(tmp_path):
    """A SIGUSR1 during training, with save_strategy='no': the run saves one checkpoint and exits 75 (by default,
    with no checkpoints saved, nothing watches the signal and it ends the process)."""
    import subprocess
    import sys

    from tests.distributed import REPO, worker_env

    result = subprocess.run([sys.executable, str(HERE / "preemption_worker.py"), str(tmp_path)], capture_output=True,
                            text=True, timeout=200, env=worker_env(), cwd=REPO)
    assert result.returncode == 75, result.stderr[-3000:]
    assert checkpoints(tmp_path) == ["checkpoint-2"]


# --- the best model --------------------------------------------------------------------------------------------------
def best_model_run(tmp_path, scores, **fields):
    """Evaluate and save at every step of 4, scores as given: the final weights, each checkpoint's weights, and
    each evaluation's loss."""
    values = iter(scores)
    trainer = quick(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
                    load_best_model_at_end=True, compute_metrics=lambda prediction: {"score": next(values)}, **fields)
    trainer.train()
    saved = {name: load_file(str(tmp_path / "out" / name / "model.safetensors")) for name in checkpoints(tmp_path / "out")}
    return final_weights(trainer), saved, logged(trainer, "eval_loss")


def same_weights(a, b) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


SCORES = [9.0, 1.0, 2.0, 3.0]  # highest at step 1, lowest at step 2


def p_load_best_model_at_end(tmp_path):
    final, saved, _ = best_model_run(tmp_path, SCORES, metric_for_best_model="score")
    assert same_weights(final, saved["checkpoint-1"]) and not same_weights(final, saved["checkpoint-4"])


def p_metric_for_best_model(tmp_path):
    """The best 'score' (highest: its default direction) is step 1's; the default metric, the evaluation loss
    (lowest), picks another step, so the weights loaded at the end tell which metric decided."""
    final, saved, losses = best_model_run(tmp_path, SCORES, metric_for_best_model="score")
    assert losses.index(min(losses)) != 0, losses  # the loss would choose another checkpoint
    assert same_weights(final, saved["checkpoint-1"])


def p_greater_is_better(tmp_path):
    """greater_is_better=False for 'score': the lowest score wins (by default, for a name without 'loss', the highest)."""
    final, saved, _ = best_model_run(tmp_path, SCORES, metric_for_best_model="score", greater_is_better=False)
    assert same_weights(final, saved["checkpoint-2"])


# --- resuming --------------------------------------------------------------------------------------------------------
def p_ignore_data_skip(tmp_path):
    """Resumed mid-epoch: by default the epoch goes on where it stopped; with ignore_data_skip it starts over, so
    the first batches after the resume are the epoch's first ones."""
    make_trainer(str(tmp_path / "out"), max_steps=6, stop_after=2, eval_strategy="no").train()

    def inputs_after_resume(**fields) -> torch.Tensor:
        trainer = make_trainer(str(tmp_path / "out"), max_steps=3, eval_strategy="no", save_strategy="no", **fields)
        seen = record_forwards(trainer)
        trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
        return torch.cat([f.inputs for f in seen if f.training])

    fresh = make_trainer(str(tmp_path / "fresh"), max_steps=1, eval_strategy="no", save_strategy="no")
    first_window = record_forwards(fresh)
    fresh.train()
    assert torch.equal(inputs_after_resume(ignore_data_skip=True), torch.cat([f.inputs for f in first_window]))


def p_callback_states(tmp_path):
    from trainkit.trainer import ExportableState

    class Counter(TrainerCallback, ExportableState):  # stored in trainer_state.json, as transformers stores one
        def __init__(self):
            self.count = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.count += 1

        def state(self):
            return {"args": {}, "attributes": {"count": self.count}}

    first = make_trainer(str(tmp_path / "out"), max_steps=2, stop_after=2, eval_strategy="no")
    first.add_callback(Counter())
    first.train()
    resumed = make_trainer(str(tmp_path / "out"), max_steps=4, eval_strategy="no",
                           restore_callback_states_from_checkpoint=True)
    resumed.add_callback(Counter())
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    counter = resumed.pop_callback(Counter)  # restoring rebuilds the callback from its state, as transformers does
    assert counter.count == 2 + 2  # the saved count, restored, plus the 2 steps after the resume (default: 2)


__all__ = [name for name in dir() if name.startswith("p_")]
