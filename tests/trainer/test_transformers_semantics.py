"""Trainer behaviours that transformers' own tests/trainer found to differ, each pinned with our own models and data.

Every test here runs on CPU in the pytest process (one process, no process group). The harness that runs
transformers' test files against trainkit is described in docs/upstream-tests.md.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

from tests.trainer.helpers import EchoModel, IndexDataset
from trainkit import Trainer, TrainerCallback, TrainingArguments
from trainkit.config.errors import ConfigError


def _args(tmp_path, **extra) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
                    per_device_train_batch_size=4, max_steps=2, logging_steps=1, learning_rate=0.1)
    settings.update(extra)
    return TrainingArguments(**settings)


# ----------------------------------------------------------------------------- logging


def test_nan_inf_filter_counts_a_diverged_step_as_the_mean_so_far():
    """A NaN/inf step adds (sum of the log's earlier steps) / (their number + 1), 0 for a log's first step, so
    a logged loss stays finite even when every step of its interval diverged; without the filter it is NaN."""
    from trainkit import Accelerator
    from trainkit.trainer.meter import TrainingMeter

    def logged(losses, skip):
        meter = TrainingMeter(Accelerator(cpu=True), num_parameters=1)
        for loss in losses:
            meter.add_step(torch.tensor(loss), skip)
        return meter.flush()["loss"], meter.train_loss

    nan = float("nan")
    assert logged([2.0, nan, 4.0], True) == (pytest.approx(7.0 / 3), pytest.approx(7.0 / 3))  # 2 + 2/2 + 4
    assert logged([nan, float("inf"), nan], True) == (0.0, 0.0)
    assert all(math.isnan(value) for value in logged([2.0, nan], False))


def test_log_level_info_shows_the_run_plan_and_reaches_transformers_loggers(tmp_path, caplog):
    from transformers.utils import logging as transformers_logging

    before = transformers_logging.get_verbosity()
    try:
        with caplog.at_level(logging.INFO, logger="trainkit"):
            Trainer(model=EchoModel(), args=_args(tmp_path, log_level="info"), train_dataset=IndexDataset(8)).train()
        assert transformers_logging.get_verbosity() == logging.INFO
    finally:
        transformers_logging.set_verbosity(before)
        logging.getLogger("trainkit").setLevel(logging.NOTSET)
    plan = next(record.getMessage() for record in caplog.records if "Running training" in record.getMessage())
    assert "examples: 8" in plan and "global batch size: 4" in plan and "optimizer steps: 2" in plan


# ----------------------------------------------------------------------------- evaluation and prediction


def test_predict_returns_predictions_under_batch_eval_metrics(tmp_path):
    calls = []

    def batched_metric(prediction, compute_result):
        calls.append(compute_result)
        return {"batches": len(calls)} if compute_result else {}

    args = _args(tmp_path, batch_eval_metrics=True, per_device_eval_batch_size=3)
    output = Trainer(model=EchoModel(), args=args, compute_metrics=batched_metric).predict(IndexDataset(7))
    assert output.predictions.tolist() == list(range(7)) and output.label_ids.tolist() == list(range(7))
    assert calls == [False, False, True] and output.metrics["test_batches"] == 3


class Stream(IterableDataset):
    """IndexDataset's samples as a stream without a length."""

    def __iter__(self):
        dataset = IndexDataset(7, shift=1.0)
        return (dataset[i] for i in range(len(dataset)))


def test_evaluate_a_stream_without_length_with_the_progress_bar(tmp_path):
    args = _args(tmp_path, disable_tqdm=False, per_device_eval_batch_size=3)
    metrics = Trainer(model=EchoModel(), args=args).evaluate(Stream())
    assert metrics["eval_loss"] == pytest.approx(1.0)  # every prediction is 1 below its label


def test_get_eval_dataloader_by_name_and_fresh_unless_workers_persist(tmp_path):
    first, second = IndexDataset(5), IndexDataset(6)
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path), eval_dataset={"first": first, "second": second})
    assert trainer.get_eval_dataloader("second").dataset is second
    assert trainer.get_eval_dataloader("first") is not trainer.get_eval_dataloader("first")  # rebuilt: args apply
    persistent = _args(tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer = Trainer(model=EchoModel(), args=persistent, eval_dataset={"first": first})
    assert trainer.get_eval_dataloader("first") is trainer.get_eval_dataloader("first")  # its workers live on


def test_predict_reports_memory_metrics_when_asked(tmp_path):
    metrics = Trainer(model=EchoModel(), args=_args(tmp_path, skip_memory_metrics=False)).predict(IndexDataset(4)).metrics
    assert "test_mem_cpu_alloc_delta" in metrics
    metrics = Trainer(model=EchoModel(), args=_args(tmp_path)).predict(IndexDataset(4)).metrics
    assert not any("_mem_" in key for key in metrics)


class MultiLabelEcho(EchoModel):
    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"problem_type": "multi_label_classification"})()


def test_label_smoothing_is_off_with_a_warning_for_multi_label_models(tmp_path):
    from transformers.trainer_pt_utils import LabelSmoother

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(model=MultiLabelEcho(), args=_args(tmp_path, label_smoothing_factor=0.1))
    assert trainer.label_smoother is None
    assert [str(w.message) for w in caught if "multi-label" in str(w.message)]
    smoother = Trainer(model=EchoModel(), args=_args(tmp_path, label_smoothing_factor=0.1)).label_smoother
    assert isinstance(smoother, LabelSmoother) and smoother.epsilon == 0.1


# ----------------------------------------------------------------------------- callbacks


def test_listed_callbacks_are_transformers_and_the_log_files_are_still_written(tmp_path):
    class Mine(TrainerCallback):
        pass

    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, run_name="run", report_to="jsonl"),
                      train_dataset=IndexDataset(8), callbacks=[Mine])
    names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    import transformers

    if importlib.util.find_spec("accelerate") is not None:  # transformers' Trainer needs it (absent as users install us)
        class Theirs(transformers.TrainerCallback):
            pass

        Theirs.__name__ = "Mine"
        oracle = transformers.Trainer(model=EchoModel(), args=transformers.TrainingArguments(
            str(tmp_path / "oracle"), use_cpu=True, report_to="none", disable_tqdm=True), callbacks=[Theirs])
        assert names == [type(callback).__name__ for callback in oracle.callback_handler.callbacks]
    assert names == ["DefaultFlowCallback", "Mine", "PrinterCallback"]  # the progress callback added last
    trainer.train()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len([line for line in lines if "loss" in json.loads(line)]) >= 2  # one per logged step


def test_a_second_callback_of_one_class_is_named_in_the_warning_itself(tmp_path):
    from trainkit.trainer import callbacks

    class Twice(TrainerCallback):
        pass

    messages = []
    original = callbacks.logger.warning
    callbacks.logger.warning = lambda message, *args, **kwargs: messages.append(message)
    try:
        Trainer(model=EchoModel(), args=_args(tmp_path), callbacks=[Twice, Twice])
    finally:
        callbacks.logger.warning = original
    assert any("Twice" in message for message in messages)


# ----------------------------------------------------------------------------- arguments


def test_save_strategy_best_needs_a_metric_and_load_best_defaults_to_loss():
    with pytest.raises(ConfigError, match="metric_for_best_model` must be provided"):
        TrainingArguments(eval_strategy="epoch", save_strategy="best")
    args = TrainingArguments(eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True)
    assert (args.metric_for_best_model, args.greater_is_better) == ("loss", False)


def test_torch_compile_names_its_backend():
    assert TrainingArguments(torch_compile=True).torch_compile_backend == "inductor"
    compiled = TrainingArguments(torch_compile_mode="reduce-overhead")
    assert compiled.torch_compile and compiled.torch_compile_backend == "inductor"
    assert TrainingArguments().torch_compile_backend is None


def test_torch_empty_cache_steps_is_a_whole_count():
    with pytest.raises(ConfigError, match="torch_empty_cache_steps=1.0"):
        TrainingArguments(torch_empty_cache_steps=1.0)


def test_to_dict_writes_dtypes_and_the_accelerator_config_as_json_values():
    @dataclasses.dataclass
    class WithDtype(TrainingArguments):
        dtype: torch.dtype = torch.float32

    values = WithDtype(dtype=torch.bfloat16, accelerator_config={"even_batches": False}).to_dict()
    assert values["dtype"] == "bfloat16" and values["accelerator_config"]["even_batches"] is False
    assert json.loads(WithDtype().to_json_string())["dtype"] == "float32"


def test_accelerator_config_forms(tmp_path):
    from transformers.trainer_pt_utils import AcceleratorConfig

    with pytest.raises(NotImplementedError, match="callable to `accelerator_config`"):
        TrainingArguments(accelerator_config=AcceleratorConfig)
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps({"even_batches": False}))
    assert TrainingArguments(accelerator_config=path).accelerator_config.even_batches is False  # a Path
    args = _args(tmp_path, accelerator_config=AcceleratorConfig(split_batches=True))
    args.accelerator_config.even_batches = False  # scripts change it after building the arguments
    accelerator = Trainer(model=EchoModel(), args=args).accelerator
    assert accelerator.split_batches is True and accelerator.even_batches is False


def test_gradient_accumulation_kwargs_as_transformers_reads_them(tmp_path, caplog):
    from trainkit.trainer.training_arguments.engine_settings import engine_options

    args = TrainingArguments(accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 3}})
    assert args.gradient_accumulation_steps == 3
    with pytest.raises(ConfigError, match="name one setting with two values"):
        TrainingArguments(gradient_accumulation_steps=2, accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 3}})
    with pytest.raises(ConfigError, match="num_steps"):
        TrainingArguments(accelerator_config={"gradient_accumulation_kwargs": {"num_step": 3}})
    synced = TrainingArguments(accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}})
    assert engine_options(synced)["gradient_accumulation_plugin"].sync_each_batch is True
    assert "gradient_accumulation_plugin" not in engine_options(TrainingArguments())
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        TrainingArguments(accelerator_config={"gradient_accumulation_kwargs": {"adjust_scheduler": False}})
    assert "changes nothing in the Trainer" in caplog.text


def test_use_configured_state_needs_a_state(monkeypatch):
    from trainkit import PartialState
    from trainkit.engine.process.state import ProcessState

    monkeypatch.setattr(ProcessState, "_instance", None)
    with pytest.raises(ConfigError, match="there is none yet"):
        TrainingArguments(accelerator_config={"use_configured_state": True})
    PartialState(cpu=True)
    TrainingArguments(accelerator_config={"use_configured_state": True})


# ----------------------------------------------------------------------------- checkpoints


class Line(nn.Module):
    """y = a * x + b with two 0-dimensional parameters (torch's full-state loader needs a process group for
    such a model; a single process has none)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.tensor(0.5)), nn.Parameter(torch.tensor(0.0))

    def forward(self, x, labels=None):
        prediction = self.a * x.squeeze(-1) + self.b
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def test_a_model_of_scalar_parameters_resumes_exactly_on_one_process(tmp_path):
    def run(output_dir, **extra):
        torch.manual_seed(0)
        args = _args(output_dir, max_steps=4, save_strategy="steps", save_steps=2, learning_rate=0.01, **extra)
        trainer = Trainer(model=Line(), args=args, train_dataset=IndexDataset(16))
        return trainer

    straight = run(tmp_path / "straight")
    straight.train()
    resumed = run(tmp_path / "straight", logging_steps=2)  # the same run's checkpoint-2, a changed log interval
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2"))
    assert (resumed.model.a.item(), resumed.model.b.item()) == (straight.model.a.item(), straight.model.b.item())


class Recorder(nn.Module):
    """Keeps every input it saw in a buffer that grows, and overrides load_state_dict to take the saved size."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(1))
        self.register_buffer("seen", torch.empty(0))
        self.loads = 0

    def load_state_dict(self, state_dict, strict=True):
        self.loads += 1
        self.seen = state_dict["seen"].clone()
        return super().load_state_dict(state_dict, strict=strict)

    def forward(self, x, labels=None):
        self.seen = torch.cat([self.seen, x.squeeze(-1).detach()])
        prediction = x.squeeze(-1) + self.offset
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def test_resume_loads_weights_through_the_models_own_load_state_dict(tmp_path):
    """A model overriding load_state_dict (here: a buffer whose size changes) resumes through it, once, as
    transformers.Trainer loads it; the resumed run then sees the batches the uninterrupted one saw after step 2."""
    def run(**extra):
        torch.manual_seed(0)
        return Trainer(model=Recorder(), train_dataset=IndexDataset(16),
                       args=_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, seed=3, **extra))

    straight = run()
    straight.train()
    resumed = run()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.model.loads == 1
    assert torch.equal(resumed.model.seen, straight.model.seen) and straight.model.seen.numel() == 16
    assert torch.equal(resumed.model.offset, straight.model.offset)


def test_resume_warns_about_intervals_that_differ_from_the_checkpoint(tmp_path, caplog):
    args = _args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8)).train()
    changed = _args(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, per_device_train_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        Trainer(model=EchoModel(), args=changed, train_dataset=IndexDataset(8)).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert "save_steps: 1 (from args) != 2 (from trainer_state.json)" in caplog.text
    assert "per_device_train_batch_size: 2 (from args) != 4 (from trainer_state.json)" in caplog.text


# ----------------------------------------------------------------------------- inspection


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                    reason="transformers.Trainer (the oracle) needs accelerate, absent here as users install trainkit")
def test_learning_rates_and_trainable_parameters_as_transformers_reports_them(tmp_path):
    """get_learning_rates (one value per parameter group, after a warm-up step) and
    get_num_trainable_parameters (frozen parameters left out) equal transformers.Trainer's on the same model."""
    import transformers

    def model():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1))
        net[2].weight.requires_grad_(False)
        return net

    settings = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=0.3, weight_decay=0.1,
                    warmup_steps=4, max_steps=8)
    found = []
    for trainer in (Trainer(model=model(), args=TrainingArguments(**settings)),
                    transformers.Trainer(model=model(), args=transformers.TrainingArguments(**settings))):
        with pytest.raises(ValueError):
            trainer.get_learning_rates()
        trainer.create_optimizer_and_scheduler(num_training_steps=8)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        found.append((trainer.get_learning_rates(), trainer.get_num_trainable_parameters()))
    assert found[0] == found[1]
    assert len(found[0][0]) == 2 and found[0][1] == 3 * 4 + 4 + 4 + 4 + 1
