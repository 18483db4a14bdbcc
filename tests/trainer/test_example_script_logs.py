"""What transformers' example scripts (run_glue, run_clm, ...) read back from a Trainer after changing only
their imports, on CPU in one process: the learning rate in each training log is the rate that step used, the
metrics ``train()`` and ``evaluate()`` return carry ``epoch`` (the scripts save them with ``save_metrics``), and
``total_flos`` counts what transformers' models count. The installed transformers is the oracle."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import get_scheduler

from tests.trainer.helpers import tiny_bert
from trainkit import Trainer, TrainingArguments

STEPS, BATCH, LENGTH = 4, 4, 8


def _dataset() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(5, 60, (LENGTH,), generator=generator),
             "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": torch.tensor(index % 2)}
            for index in range(STEPS * BATCH)]


def _trained(tmp_path):
    data = _dataset()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
                             save_strategy="no", per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                             max_steps=STEPS, logging_steps=1, learning_rate=1e-3, warmup_steps=1, seed=3)
    trainer = Trainer(model=tiny_bert(vocab_size=64), args=args, train_dataset=data, eval_dataset=data)
    return trainer, trainer.train(), trainer.evaluate()


def test_logged_learning_rate_is_the_rate_of_that_step(tmp_path):
    """CPU, one process: transformers logs the rate read after optimizer.step() and before the schedule moves."""
    trainer, _, _ = _trained(tmp_path)
    logged = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=trainer.args.learning_rate)
    schedule = get_scheduler(trainer.args.lr_scheduler_type, optimizer, num_warmup_steps=1, num_training_steps=STEPS)
    expected = []
    for _ in range(STEPS):
        expected.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert logged == expected


def test_returned_metrics_carry_the_epoch(tmp_path):
    """CPU, one process: Trainer.log adds ``epoch`` to the dict it is given, so the returned metrics have it."""
    trainer, train_output, eval_metrics = _trained(tmp_path)
    assert train_output.metrics["epoch"] == trainer.state.epoch
    assert eval_metrics["epoch"] == trainer.state.epoch
    assert "step" not in eval_metrics  # the step goes only into log_history


def test_total_flos_is_the_models_floating_point_ops(tmp_path):
    """CPU, one process: transformers' Trainer.floating_point_ops of each batch trained on, summed."""
    trainer, train_output, _ = _trained(tmp_path)
    model = trainer.accelerator.unwrap_model(trainer.model)
    batch = {"input_ids": torch.zeros(BATCH, LENGTH, dtype=torch.long)}
    per_batch = transformers.Trainer.floating_point_ops(SimpleNamespace(model=model), batch)
    assert per_batch > 0
    assert train_output.metrics["total_flos"] == STEPS * per_batch
    assert trainer.state.total_flos == train_output.metrics["total_flos"]


def test_callback_handler_events_take_transformers_positional_arguments():
    """CPU, no training: each handler event method accepts the positional parameters of the installed
    transformers' CallbackHandler method (trainer_qa.py calls ``on_evaluate(args, state, control, metrics)``)."""
    from trainkit.trainer.callbacks import EVENTS, CallbackHandler, TrainerCallback, TrainerControl, TrainerState

    seen: dict[str, dict] = {}

    class Recorder(TrainerCallback):
        def __getattribute__(self, name):
            if name in EVENTS:
                return lambda args, state, control, **kwargs: seen.__setitem__(name, kwargs)
            return super().__getattribute__(name)

    handler = CallbackHandler([Recorder()], None, None, None, None)
    theirs = transformers.trainer_callback.CallbackHandler
    for event in EVENTS:
        extra = [name for name, parameter in inspect.signature(getattr(theirs, event)).parameters.items()
                 if parameter.kind is parameter.POSITIONAL_OR_KEYWORD][4:]
        getattr(handler, event)(None, TrainerState(), TrainerControl(), *[f"{event}:{name}" for name in extra])
        assert {name: seen[event][name] for name in extra} == {name: f"{event}:{name}" for name in extra}
    with pytest.raises(TypeError, match="on_save"):
        handler.on_save(None, TrainerState(), TrainerControl(), "unexpected")


def test_evaluation_loop_is_a_trainer_method_as_subclasses_call_it(tmp_path):
    """CPU, one process: the QuestionAnsweringTrainer pattern — get_eval_dataloader, then self.evaluation_loop with
    transformers' signature — on a Trainer that has not trained, and the same figures as evaluate()."""
    ours = inspect.signature(Trainer.evaluation_loop).parameters
    theirs = inspect.signature(transformers.Trainer.evaluation_loop).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [(p.name, p.kind, p.default) for p in theirs.values()]
    data = _dataset()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
                             per_device_eval_batch_size=BATCH)
    trainer = Trainer(model=tiny_bert(vocab_size=64), args=args, eval_dataset=data)
    output = trainer.evaluation_loop(trainer.get_eval_dataloader(), description="Evaluation",
                                     prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval")
    assert output.num_samples == len(data) and output.predictions.shape == (len(data), 2)
    assert output.metrics["eval_loss"] == pytest.approx(trainer.evaluate()["eval_loss"], rel=1e-6)
