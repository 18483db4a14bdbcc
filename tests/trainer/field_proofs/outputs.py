"""Proofs of the fields that decide what a run reports: logs, trackers, evaluations and predictions, the Hub, and
the fields scripts read (CPU, one process)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from tests.trainer.checkpoint_workload import DropoutRegressor, RegressionData
from tests.trainer.helpers import EchoModel, IndexDataset, TinyTokenModel, TokenDataset
from trainkit import Trainer, TrainerCallback, TrainingArguments

from .common import calls_of, log_steps, logged, quick


# --- training logs ------------------------------------------------------------------------------------------
def train_logs(tmp_path, **fields) -> list[int]:
    trainer = quick(tmp_path, max_steps=4, **fields)
    trainer.train()
    return log_steps(trainer, "loss")


def p_logging_strategy(tmp_path):
    assert train_logs(tmp_path, logging_strategy="no") == []  # the workload logs every step


def p_logging_steps(tmp_path):
    assert train_logs(tmp_path, logging_steps=2) == [2, 4]  # the default, 500: no step of 4


def p_logging_first_step(tmp_path):
    assert train_logs(tmp_path, logging_steps=3, logging_first_step=True) == [1, 3]


def p_nan_filter(tmp_path):
    """Step 2's loss is NaN: with the filter off the logged mean of steps 1-2 is NaN (the default leaves step 2 out)."""
    class NaNAtStep2(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                trainer.model.layers[0].weight.data.fill_(float("nan"))

    trainer = quick(tmp_path, max_steps=2, logging_steps=2, logging_nan_inf_filter=False)
    trainer.add_callback(NaNAtStep2())
    trainer.train()
    assert np.isnan(logged(trainer, "loss")[0])


def p_tokens_seen(tmp_path):
    """Every input id counts: 2 steps x 2 sequences x 6 tokens."""
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", disable_tqdm=True, logging_steps=1, include_num_input_tokens_seen="all")
    trainer = Trainer(model=TinyTokenModel(), args=args, train_dataset=TokenDataset(8))
    trainer.train()
    assert logged(trainer, "num_input_tokens_seen")[:2] == [12, 24]


def p_log_level(tmp_path, caplog):
    """log_level='debug': trainkit's debug lines reach the handlers (by default only warnings do)."""
    trainkit_logger = logging.getLogger("trainkit")
    try:
        trainer = quick(tmp_path, log_level="debug")
        caplog.clear()
        trainer.evaluate()
        assert any(r.levelno == logging.DEBUG and r.name.startswith("trainkit") for r in caplog.records)
    finally:
        trainkit_logger.setLevel(logging.NOTSET)


def p_disable_tqdm(tmp_path, capfd):
    """disable_tqdm=True: no progress bar on stderr (by default, with warnings shown, there is one)."""
    def bars(**fields) -> str:
        quick(tmp_path / str(fields), max_steps=2, **fields).train()
        return capfd.readouterr().err

    assert "2/2 [" in bars(disable_tqdm=False)  # tqdm's "2/2 [00:00<..." proves the bar can be seen here
    assert "2/2 [" not in bars(disable_tqdm=True)


def event_files(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("events.out.tfevents*")) if folder.exists() else []


def p_report_to(tmp_path):
    pytest.importorskip("tensorboard", reason="report_to='tensorboard' needs the optional tensorboard package")
    quick(tmp_path, report_to="tensorboard").train()
    assert event_files(tmp_path / "out")  # default 'none': the JSONL log only


def p_logging_dir(tmp_path):
    pytest.importorskip("tensorboard", reason="report_to='tensorboard' needs the optional tensorboard package")
    quick(tmp_path, report_to="tensorboard", logging_dir=str(tmp_path / "tb")).train()
    assert event_files(tmp_path / "tb")  # by default under output_dir


def p_run_name(tmp_path):
    quick(tmp_path, run_name="named", report_to="jsonl").train()
    assert (tmp_path / "out" / "named" / "metrics.jsonl").exists() and not (tmp_path / "out" / "logs").exists()


# --- evaluation during training -----------------------------------------------------------------------------
def eval_steps_of(tmp_path, **fields) -> list[int]:
    trainer = quick(tmp_path, max_steps=4, **fields)
    trainer.train()
    return log_steps(trainer, "eval_loss")


def p_eval_strategy(tmp_path):
    assert eval_steps_of(tmp_path, eval_strategy="steps") == [1, 2, 3, 4]  # the workload's eval_steps=1


def p_eval_steps(tmp_path):
    assert eval_steps_of(tmp_path, eval_strategy="steps", eval_steps=2) == [2, 4]


def p_eval_delay(tmp_path):
    assert eval_steps_of(tmp_path, eval_strategy="steps", eval_delay=3) == [3, 4]


def p_eval_on_start(tmp_path):
    assert eval_steps_of(tmp_path, eval_strategy="steps", eval_steps=4, eval_on_start=True) == [0, 4]


# --- evaluation and prediction outputs --------------------------------------------------------------------------
def p_eval_accumulation(tmp_path, monkeypatch):
    """Gathered rows move to host memory every eval_accumulation_steps batches: trainkit's spill calls counted
    (on CPU device and host memory are one, so the call is what can be seen)."""
    from trainkit.trainer import evaluation

    spills = calls_of(monkeypatch, evaluation._GatheredResults, "spill")
    quick(tmp_path, per_device_eval_batch_size=2, eval_accumulation_steps=1).predict(RegressionData(8))
    # after each of the 4 batches, plus one per result read at the end (4 without the field)
    assert len(spills) == 8, len(spills)


def p_prediction_loss_only(tmp_path):
    output = quick(tmp_path, prediction_loss_only=True).predict(RegressionData(4))
    assert output.predictions is None and output.label_ids is None and "test_loss" in output.metrics


def p_include_for_metrics(tmp_path):
    seen = {}

    def metrics(prediction):
        seen["inputs"] = prediction.inputs
        return {}

    data = TokenDataset(4)
    args = TrainingArguments(str(tmp_path), include_for_metrics=["inputs"], report_to="none", disable_tqdm=True)
    Trainer(model=TinyTokenModel(), args=args, compute_metrics=metrics).evaluate(data)
    assert seen["inputs"] is not None and np.array_equal(seen["inputs"], data.input_ids.numpy())


def echo_predictions(tmp_path, **fields):
    args = TrainingArguments(str(tmp_path), report_to="none", disable_tqdm=True, per_device_eval_batch_size=5, **fields)
    return Trainer(model=EchoModel(), args=args).predict(IndexDataset(13)).predictions


def p_eval_do_concat_batches(tmp_path):
    predictions = echo_predictions(tmp_path, eval_do_concat_batches=False)
    assert type(predictions) is list and [len(batch) for batch in predictions] == [5, 5, 3]  # default: one array


def p_eval_use_gather_object(tmp_path):
    """One Python object per sample (gather_object), not one array of rows."""
    predictions = echo_predictions(tmp_path, eval_use_gather_object=True)
    assert type(predictions) is list and [float(p) for p in predictions] == [float(i) for i in range(13)]


def p_batch_eval_metrics(tmp_path):
    calls = []

    def metrics(prediction, compute_result=None):
        calls.append((len(prediction.predictions), compute_result))
        return {"batches": len(calls)} if compute_result else {}

    args = TrainingArguments(str(tmp_path), batch_eval_metrics=True, per_device_eval_batch_size=5, report_to="none")
    result = Trainer(model=EchoModel(), args=args, eval_dataset=IndexDataset(13), compute_metrics=metrics).evaluate()
    assert calls == [(5, False), (5, False), (3, True)] and result["eval_batches"] == 3  # default: once, all 13


def p_label_names(tmp_path):
    """The labels are read from the key named: predict returns them as label_ids."""
    class Targets(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": torch.tensor([float(i)]), "target": torch.tensor(10.0 + i)}

    class EchoTarget(EchoModel):
        def forward(self, x, target=None):
            return super().forward(x, labels=target)

    args = TrainingArguments(str(tmp_path), label_names=["target"], report_to="none", disable_tqdm=True)
    output = Trainer(model=EchoTarget(), args=args).predict(Targets())
    assert output.label_ids is not None and output.label_ids.tolist() == [10.0, 11.0, 12.0, 13.0]


def p_skip_memory_metrics(tmp_path):
    trainer = quick(tmp_path, skip_memory_metrics=False)
    assert "train_mem_cpu_alloc_delta" in trainer.train().metrics  # transformers' memory tracker's keys
    assert "eval_mem_cpu_alloc_delta" in trainer.evaluate()


def p_debug(tmp_path):
    """underflow_overflow: transformers' DebugUnderflowOverflow stops the run at the first inf activation."""
    def infinite_bias():
        model = DropoutRegressor()
        model.layers[0].bias.data.fill_(float("inf"))
        return model

    trainer = quick(tmp_path, model_init=infinite_bias, debug="underflow_overflow")
    with pytest.raises(ValueError, match="inf/nan detected"):  # without it, training goes on with NaN losses
        trainer.train()


# --- the Hub: what the Hub client received (a recording stand-in, no network) --------------------------------------
def hub_calls(tmp_path, monkeypatch, **fields) -> list[tuple[str, dict]]:
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    class RecordingApi:
        def __init__(self, token=None):
            calls.append(("token", {"token": token}))

        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    settings = {"push_to_hub": True, "hub_model_id": "me/model", **fields}
    quick(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, **settings).train()
    return calls


def of_kind(calls, kind: str) -> list[dict]:
    return [kwargs for name, kwargs in calls if name == kind]


def p_push_to_hub(tmp_path, monkeypatch):
    uploads = of_kind(hub_calls(tmp_path, monkeypatch), "upload_folder")
    assert [u["repo_id"] for u in uploads] == ["me/model", "me/model"]  # every save (the default: no Hub at all)


def p_hub_model_id(tmp_path, monkeypatch):
    created = of_kind(hub_calls(tmp_path, monkeypatch, hub_model_id="someone/named"), "create_repo")
    assert [c["repo_id"] for c in created] == ["someone/named"]  # default: the output_dir's name


def p_hub_strategy(tmp_path, monkeypatch):
    uploads = of_kind(hub_calls(tmp_path, monkeypatch, hub_strategy="checkpoint"), "upload_folder")
    assert [u["path_in_repo"] for u in uploads] == ["checkpoint-1", "checkpoint-2"]  # 'every_save': the model


def p_hub_token(tmp_path, monkeypatch):
    assert {"token": "hf_token"} in of_kind(hub_calls(tmp_path, monkeypatch, hub_token="hf_token"), "token")


def p_hub_private_repo(tmp_path, monkeypatch):
    created = of_kind(hub_calls(tmp_path, monkeypatch, hub_private_repo=True), "create_repo")
    assert [c.get("private") for c in created] == [True]


def p_hub_revision(tmp_path, monkeypatch):
    uploads = of_kind(hub_calls(tmp_path, monkeypatch, hub_revision="dev"), "upload_folder")
    assert len(uploads) == 2 and {u.get("revision") for u in uploads} == {"dev"}


# --- read by scripts, not by any Trainer: the installed transformers is the oracle ------------------------------------
def p_for_scripts(name: str, value, tmp_path):
    """``HfArgumentParser`` gives trainkit's arguments the value transformers' get from the same command line
    (scripts such as run_glue.py read it: ``if training_args.do_train``)."""
    from transformers import HfArgumentParser

    from tests.trainer.transformers_oracle import transformers_arguments

    flag = [f"--{name}"] if value is True else [f"--{name}", str(value)]
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", *flag]
    (ours,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv)
    theirs = transformers_arguments(argv)
    assert getattr(ours, name) == getattr(theirs, name) == value


def p_do_train(tmp_path):
    p_for_scripts("do_train", True, tmp_path)


def p_do_eval(tmp_path):
    p_for_scripts("do_eval", True, tmp_path)


def p_do_predict(tmp_path):
    p_for_scripts("do_predict", True, tmp_path)


def p_resume_from_checkpoint(tmp_path):
    p_for_scripts("resume_from_checkpoint", "runs/checkpoint-5", tmp_path)


__all__ = [name for name in dir() if name.startswith("p_")]
