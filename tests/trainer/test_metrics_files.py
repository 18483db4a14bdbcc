"""The files a script's closing lines write (save_metrics, save_state, the metrics log), on CPU in one process,
compared with transformers' real Trainer methods (the oracle)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers

from tests.trainer.helpers import EchoModel, IndexDataset
from trainkit import Trainer, TrainingArguments


def _args(output_dir: Path, **extra) -> TrainingArguments:
    settings = dict(output_dir=str(output_dir), use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
                    per_device_train_batch_size=4, max_steps=2, logging_steps=1, learning_rate=0.1)
    settings.update(extra)
    return TrainingArguments(**settings)


@pytest.mark.parametrize("method", ["save_metrics", "log_metrics", "save_state"])
def test_signatures_are_transformers(method):
    theirs = inspect.signature(getattr(transformers.Trainer, method)).parameters
    ours = inspect.signature(getattr(Trainer, method)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [(p.name, p.kind, p.default) for p in theirs.values()]


def _save_sequence(save_metrics) -> None:
    """What run_glue.py / run_clm.py do at the end, plus a split kept out of all_results.json."""
    save_metrics("train", {"train_loss": 0.5, "epoch": 1.0, "train_runtime": 2.25})
    save_metrics("eval", {"eval_loss": 0.75, "eval_accuracy": 0.8, "epoch": 1.0})
    save_metrics("test", {"test_loss": 0.7}, combined=False)


def _files(folder: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(folder.iterdir()) if path.suffix == ".json"}


def test_save_metrics_writes_the_files_transformers_writes(tmp_path):
    oracle_dir, ours_dir = tmp_path / "transformers", tmp_path / "trainkit"
    oracle_dir.mkdir()
    stand_in = SimpleNamespace(args=SimpleNamespace(output_dir=str(oracle_dir)), is_world_process_zero=lambda: True)
    _save_sequence(lambda *a, **k: transformers.Trainer.save_metrics(stand_in, *a, **k))
    trainer = Trainer(model=EchoModel(), args=_args(ours_dir), train_dataset=IndexDataset())
    _save_sequence(trainer.save_metrics)
    ours = _files(ours_dir)
    assert set(ours) == {"all_results.json", "train_results.json", "eval_results.json", "test_results.json"}
    assert ours == _files(oracle_dir)  # byte for byte, all_results.json merging train and eval


def test_save_state_writes_trainer_state_where_transformers_does(tmp_path):
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path / "out"), train_dataset=IndexDataset())
    trainer.train()
    trainer.save_state()
    oracle_dir = tmp_path / "oracle"
    oracle_dir.mkdir()
    transformers.Trainer.save_state(SimpleNamespace(args=SimpleNamespace(output_dir=str(oracle_dir)), state=trainer.state,
                                                    is_world_process_zero=lambda: True))
    assert sorted(os.listdir(oracle_dir)) == ["trainer_state.json"]
    assert (tmp_path / "out" / "trainer_state.json").read_text() == (oracle_dir / "trainer_state.json").read_text()


def test_the_metrics_log_is_not_nested_in_a_folder_named_like_output_dir(tmp_path, monkeypatch):
    """A relative output_dir ("out", as in transformers' examples) used to give out/out/metrics.jsonl."""
    monkeypatch.chdir(tmp_path)
    Trainer(model=EchoModel(), args=_args(Path("out"), report_to="jsonl"), train_dataset=IndexDataset()).train()
    assert (tmp_path / "out" / "logs" / "metrics.jsonl").is_file()
    assert not (tmp_path / "out" / "out").exists()
    Trainer(model=EchoModel(), args=_args(Path("out"), run_name="named", report_to="jsonl"),
            train_dataset=IndexDataset()).train()
    assert (tmp_path / "out" / "named" / "metrics.jsonl").is_file()


def test_the_default_report_to_writes_no_file_transformers_would_not(tmp_path):
    """report_to="none" (transformers' default): output_dir holds what transformers' Trainer writes there, no
    trainkit log; the metrics are in state.log_history and trainer_state.json, as transformers keeps them."""
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path / "out", report_to="none"), train_dataset=IndexDataset())
    trainer.train()
    assert not (tmp_path / "out" / "logs").exists()
    assert any("loss" in entry for entry in trainer.state.log_history)


def test_throughput_goes_to_the_metrics_log_not_to_log_history(tmp_path):
    """Per-step entries of log_history (and the callbacks' logs) hold transformers' keys only; the speeds trainkit
    measures are in metrics.jsonl, on the same line as the step's loss."""
    import json

    trainer = Trainer(model=EchoModel(), args=_args(tmp_path / "out", report_to="jsonl"), train_dataset=IndexDataset())
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 2 and all(set(entry) == {"loss", "grad_norm", "learning_rate", "epoch", "step"}
                                   for entry in steps)
    lines = [json.loads(line) for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if "loss" in line]
    assert len(logged) == 2
    assert all({"samples_per_second", "step_time"} <= set(line) and line["samples_per_second"] > 0 for line in logged)
    assert [line["loss"] for line in logged] == [entry["loss"] for entry in steps]
