"""The Trainer on one process: accumulation, events, evaluation, checkpoints, best model, data handling."""

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.trainer.helpers import EchoModel, IndexDataset, TinyTokenModel, TokenDataset, train_token_model
from trainkit import EarlyStoppingCallback, Trainer, TrainerCallback, TrainingArguments
from trainkit.trainer.checkpointing import files as checkpoints

pytestmark = pytest.mark.timeout(120)


def _args(tmp_path, **extra):
    settings = dict(output_dir=str(tmp_path / "out"), disable_tqdm=True, report_to="none", save_strategy="no",
                    per_device_train_batch_size=2, learning_rate=0.1, logging_steps=1)
    settings.update(extra)
    return TrainingArguments(**settings)


def _weights(trainer):
    return {k: v.detach().cpu().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}


@pytest.mark.parametrize("size, runs", [(24, [(2, 4), (8, 1), (4, 2)]), (20, [(2, 4), (4, 2), (1, 8)])])
def test_accumulation_k_by_b_equals_one_batch(tmp_path, size, runs):
    # Token-level loss with a different number of valid labels per sample; 20 samples end on a short window.
    weights = [train_token_model(str(tmp_path / f"{b}x{k}"), b, k, size) for b, k in runs]
    for other in weights[1:]:
        assert max((weights[0][n] - other[n]).abs().max().item() for n in other) < 1e-5


class Recorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            return lambda args, state, control, **kwargs: self.events.append(name)
        return super().__getattribute__(name)


def test_recording_callback_sees_every_event_in_order(tmp_path):
    recorder = Recorder()
    args = _args(tmp_path, num_train_epochs=1, gradient_accumulation_steps=2, eval_strategy="epoch",
                 save_strategy="epoch", per_device_eval_batch_size=8)
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8), eval_dataset=IndexDataset(4),
                      callbacks=[recorder])
    trainer.train()
    trainer.predict(IndexDataset(3))
    step = ["on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log"]
    expected = (["on_init_end", "on_train_begin", "on_epoch_begin"] + step + step
                + ["on_epoch_end", "on_prediction_step", "on_log", "on_evaluate", "on_save", "on_log", "on_train_end",
                   "on_prediction_step", "on_predict"])
    assert recorder.events == expected


def test_callbacks_can_be_added_popped_and_removed(tmp_path):
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path))
    trainer.add_callback(EarlyStoppingCallback)
    assert isinstance(trainer.pop_callback(EarlyStoppingCallback), EarlyStoppingCallback)
    recorder = Recorder()
    trainer.add_callback(recorder)
    trainer.remove_callback(recorder)
    assert recorder not in trainer.callback_handler.callbacks


def test_best_model_is_loaded_at_end_and_rotation_keeps_it(tmp_path):
    scores = iter([0.9, 0.5, 0.4])  # the first evaluation is the best

    def decreasing_score(prediction):
        return {"score": next(scores)}

    args = _args(tmp_path, num_train_epochs=3, eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
                 metric_for_best_model="score", save_total_limit=1)
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8, shift=1.0),
                      eval_dataset=IndexDataset(4), compute_metrics=decreasing_score)
    trainer.train()
    output_dir = args.output_dir
    assert trainer.state.best_model_checkpoint == checkpoints.checkpoint_folder(output_dir, 4)
    assert trainer.state.best_metric == 0.9
    # save_total_limit=1 keeps the newest and the best, never deleting the best.
    assert [os.path.basename(p) for p in checkpoints.sorted_checkpoints(output_dir)] == ["checkpoint-4", "checkpoint-12"]
    best = load_file(os.path.join(trainer.state.best_model_checkpoint, "model.safetensors"))
    assert torch.equal(_weights(trainer)["offset"].cpu(), best["offset"])
    last = load_file(os.path.join(output_dir, "checkpoint-12", "model.safetensors"))
    assert not torch.equal(best["offset"], last["offset"])
    state = json.loads(open(os.path.join(output_dir, "checkpoint-12", "trainer_state.json")).read())
    assert state["global_step"] == 12 and state["best_model_checkpoint"].endswith("checkpoint-4")


def test_early_stopping_stops_after_patience(tmp_path):
    args = _args(tmp_path, num_train_epochs=10, eval_strategy="epoch", metric_for_best_model="score")
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(4), eval_dataset=IndexDataset(4),
                      compute_metrics=lambda p: {"score": 1.0}, callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])
    trainer.train()
    assert trainer.state.epoch == 3.0  # best at epoch 1, two evaluations without improvement


def test_resume_from_latest_checkpoint_continues_to_the_same_step(tmp_path):
    def run(**extra):
        torch.manual_seed(0)
        args = _args(tmp_path, num_train_epochs=2, save_strategy="epoch", optim="adamw_torch", per_device_train_batch_size=4, **extra)
        return Trainer(model=TinyTokenModel(), args=args, train_dataset=TokenDataset(16))

    full = run()
    full.train()
    expected = _weights(full)
    folder = checkpoints.latest_checkpoint(full.args.output_dir)
    assert folder.endswith("checkpoint-8")
    os.rename(folder, folder + "-moved")  # leave checkpoint-4 as the latest complete one
    os.makedirs(checkpoints.checkpoint_folder(full.args.output_dir, 6))  # an incomplete one is skipped
    resumed = run()
    output = resumed.train(resume_from_checkpoint=True)
    assert output.global_step == 8
    assert max((expected[k] - v).abs().max().item() for k, v in _weights(resumed).items()) < 1e-6


def test_predict_and_evaluate_with_variable_length_outputs(tmp_path):
    args = _args(tmp_path, per_device_eval_batch_size=3, eval_accumulation_steps=1, include_for_metrics=["inputs"])
    seen = {}

    def metrics(prediction):
        seen["inputs"] = prediction.inputs
        labels = prediction.label_ids  # with inputs included it unpacks to three items, as in transformers
        return {"valid": float((labels != -100).sum())}

    dataset = TokenDataset(7)
    trainer = Trainer(model=TinyTokenModel(), args=args, eval_dataset={"a": dataset, "b": dataset}, compute_metrics=metrics)
    result = trainer.evaluate()
    assert {"eval_a_loss", "eval_b_valid", "eval_a_runtime", "eval_b_samples_per_second"} <= set(result)
    assert result["eval_a_valid"] == float((dataset.labels != -100).sum())
    assert np.array_equal(seen["inputs"], dataset.input_ids.numpy())
    output = trainer.predict(dataset)
    assert output.predictions.shape == (7, 6, 11) and np.array_equal(output.label_ids, dataset.labels.numpy())


class TupleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, features, targets):
        return nn.functional.mse_loss(self.linear(features).squeeze(-1), targets)


def test_plain_module_with_tuple_batches(tmp_path):
    data = torch.utils.data.TensorDataset(torch.randn(12, 3), torch.randn(12))
    trainer = Trainer(model=TupleModel(), args=_args(tmp_path, num_train_epochs=1, max_grad_norm=0.0), train_dataset=data)
    output = trainer.train()
    assert output.global_step == 6 and np.isfinite(output.training_loss)
    assert "train_samples_per_second" in output.metrics


def test_datasets_columns_the_forward_does_not_take_are_dropped(tmp_path):
    from datasets import Dataset

    data = Dataset.from_dict({"x": [[float(i)] for i in range(6)], "labels": [float(i) for i in range(6)],
                              "text": [str(i) for i in range(6)]})
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, num_train_epochs=1), train_dataset=data)
    trainer.train()
    assert trainer.state.global_step == 3
    history = trainer.state.log_history
    assert set(history[0]) == {"loss", "grad_norm", "learning_rate", "epoch", "step"}  # transformers' keys, no more


def test_iterable_dataset_needs_max_steps(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(100):
                yield {"x": torch.tensor([float(i % 5)]), "labels": torch.tensor(float(i % 5))}

    with pytest.raises(ValueError, match="has no length.*set max_steps"):  # at construction, as transformers
        Trainer(model=EchoModel(), args=_args(tmp_path), train_dataset=Stream())
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, max_steps=5), train_dataset=Stream())
    assert trainer.train().global_step == 5


def test_push_to_hub_without_network_fails_at_construction(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="push_to_hub=True"):
        Trainer(model=EchoModel(), args=_args(tmp_path, push_to_hub=True, hub_model_id="me/model"))


def test_jsonl_log_is_written_when_named(tmp_path):
    args = _args(tmp_path, num_train_epochs=1, report_to="jsonl")
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(4))
    trainer.train()
    logs = [os.path.join(root, f) for root, _, files in os.walk(trainer.args.output_dir) for f in files if f.endswith(".jsonl")]
    assert logs, os.listdir(trainer.args.output_dir)
    lines = [json.loads(line) for line in open(logs[0])]
    assert any("loss" in json.dumps(line) for line in lines)
