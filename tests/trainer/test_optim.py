"""Every ``optim`` name as the installed transformers resolves it (CPU, one process).

The oracle is transformers itself: its ``Trainer.get_optimizer_cls_and_kwargs`` gives the same class and keywords
(on every declared stack), and its Trainer, where it runs (it needs Accelerate), ends two optimizer steps with
bitwise the same weights. A name whose package is missing, or that needs hardware this machine lacks, is refused
when the arguments are built, saying what to install or what it needs.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
import transformers
from torch import nn
from transformers.training_args import OptimizerNames

import trainkit
from trainkit.config.errors import ConfigError
from trainkit.trainer import optim

NAMES = [name.value for name in OptimizerNames]
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None  # transformers.Trainer needs it


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.linear = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x, labels=None):
        logits = self.head(self.bn(self.norm(self.linear(self.embed(x).mean(1)))))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([i % 6, (i * 5) % 6]), "labels": torch.tensor(i % 2)}


def _settings(name: str, **extra) -> dict:
    settings = dict(optim=name, max_steps=2, per_device_train_batch_size=8, report_to="none", use_cpu=True,
                    save_strategy="no", disable_tqdm=True, learning_rate=1e-2, weight_decay=0.1, warmup_steps=1,
                    optim_target_modules=["linear"] if name.startswith(("galore", "apollo")) else None)
    settings.update(extra)
    return settings


def _outcome(name: str, tmp_path) -> tuple[str, object]:
    """("refused", error) at construction, ("resolved", (class, kwargs)) otherwise (needing no model), or
    ("needs model", None)."""
    try:
        args = trainkit.TrainingArguments(str(tmp_path), **_settings(name))
    except ConfigError as error:
        return "refused", error
    try:
        return "resolved", trainkit.Trainer.get_optimizer_cls_and_kwargs(args)
    except ValueError:
        return "needs model", None


@pytest.mark.parametrize("name", NAMES)
def test_every_name_resolves_as_transformers_or_is_refused_saying_why(name, tmp_path):
    kind, result = _outcome(name, tmp_path)
    if kind == "refused":
        message = str(result)
        assert f"optim={name!r}" in message
        assert ("needs a package that is not installed" in message
                or ("needs a" in message and "which this machine does not have" in message))  # the hardware
        return
    if kind == "resolved" and HAS_ACCELERATE:  # transformers' TrainingArguments need accelerate to be built
        theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(transformers.TrainingArguments(
            str(tmp_path / "theirs"), **_settings(name)))
        ours_cls, ours_kwargs = result
        assert ours_cls is theirs[0]
        assert ours_kwargs == theirs[1]


def test_the_torch_optimizers_all_resolve(tmp_path):
    for name in ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"):
        assert _outcome(name, tmp_path)[0] == "resolved", name


@pytest.mark.skipif(not HAS_ACCELERATE, reason="transformers.Trainer (the oracle) needs accelerate, absent here")
@pytest.mark.parametrize("name", ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop",
                                  "lomo", "schedule_free_adamw", "schedule_free_sgd", "stable_adamw", "grokadamw"])
def test_two_steps_end_with_transformers_weights(name, tmp_path):
    if _outcome(name, tmp_path)[0] == "refused":
        pytest.skip(f"optim={name!r} needs a package not installed here")
    weights = {}
    for lib in (transformers, trainkit):
        torch.manual_seed(0)
        model = Tiny()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        trainer = lib.Trainer(model=model, args=lib.TrainingArguments(str(tmp_path / lib.__name__), **_settings(name)),
                              train_dataset=Data())
        trainer.train()
        weights[lib.__name__] = model.state_dict()
        assert any(not torch.equal(start[k], v) for k, v in model.state_dict().items()), "no step changed the weights"
    for key, value in weights["transformers"].items():
        assert torch.equal(weights["trainkit"][key], value), key


@pytest.mark.skipif(importlib.util.find_spec("schedulefree") is None, reason="schedulefree is not installed")
def test_schedule_free_optimizers_evaluate_in_eval_mode(tmp_path):
    trainer = trainkit.Trainer(model=Tiny(), args=trainkit.TrainingArguments(
        str(tmp_path), **_settings("schedule_free_adamw", eval_strategy="steps", eval_steps=1)),
        train_dataset=Data(), eval_dataset=Data())
    modes = []
    trainer.add_callback(type("Modes", (trainkit.TrainerCallback,), {
        "on_evaluate": lambda self, args, state, control, **kw: modes.append(kw["optimizer"].param_groups[0]["train_mode"]),
        "on_step_end": lambda self, args, state, control, **kw: modes.append(kw["optimizer"].param_groups[0]["train_mode"]),
    }))
    trainer.train()
    assert modes == [True, False, True, False]  # trained in train mode, evaluated in eval mode, twice


def test_hardware_names_say_what_they_need(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ConfigError, match="adalomo.*needs a CUDA GPU"):
        trainkit.TrainingArguments(str(tmp_path), optim="adalomo")
    with pytest.raises(ConfigError, match="needs a TPU"):
        trainkit.TrainingArguments(str(tmp_path), optim="adamw_torch_xla")
    if importlib.util.find_spec("lomo_optim") is not None:  # the need is real: AdaLomo's state is put on CUDA
        from lomo_optim import AdaLomo

        with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
            AdaLomo(Tiny(), lr=1e-3)


def test_optim_args_keys_the_name_does_not_read_are_named(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        trainkit.TrainingArguments(str(tmp_path), optim="adamw_torch", optim_args="amsgrad=True")
    assert "['amsgrad'] are not read by optim='adamw_torch'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        args = trainkit.TrainingArguments(str(tmp_path), optim="sgd", optim_args="momentum=0.9,nesterov=True")
    resolved = trainkit.Trainer.get_optimizer_cls_and_kwargs(args)[1]
    if "momentum" in resolved:  # transformers >= 5.17 reads SGD's optim_args; 5.1 ignores them
        assert "not read" not in caplog.text
        assert resolved == {"lr": 5e-5, "momentum": 0.9, "nesterov": True}
    else:
        assert "['momentum', 'nesterov'] are not read by optim='sgd'" in caplog.text
    with pytest.raises(ConfigError, match="expected 'key=value"):
        trainkit.TrainingArguments(str(tmp_path), optim="sgd", optim_args="momentum")


def test_decay_names_groups_and_create_optimizer_as_transformers(tmp_path):
    model = Tiny()
    args = trainkit.TrainingArguments(str(tmp_path), **_settings("sgd"))
    trainer = trainkit.Trainer(model=model, args=args, train_dataset=Data())
    theirs = transformers.Trainer.get_decay_parameter_names(None, model)
    assert trainer.get_decay_parameter_names(model) == theirs
    assert "bn.weight" in theirs and "norm.weight" not in theirs and "linear.bias" not in theirs
    other = Tiny()
    optimizer = trainer.create_optimizer(model=other)  # the model given, not the Trainer's
    assert optimizer is trainer.optimizer and optimizer.param_groups[0]["params"][0] is other.embed.weight
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert trainer.get_optimizer_group(other.linear.bias)["weight_decay"] == 0.0  # (transformers' raises here)
    assert trainer.get_optimizer_group(other.embed.weight)["weight_decay"] == 0.1
    assert trainer.get_optimizer_group() == [g["params"] for g in optimizer.param_groups]


def test_layer_wise_and_lomo_names_need_the_model(tmp_path):
    if importlib.util.find_spec("lomo_optim") is None:
        pytest.skip("lomo-optim is not installed")
    args = trainkit.TrainingArguments(str(tmp_path), **_settings("lomo"))
    model = Tiny()
    optimizer_cls, kwargs = trainkit.Trainer.get_optimizer_cls_and_kwargs(args, model)
    assert kwargs["model"] is model and optim.is_lomo(optimizer_cls(**kwargs))

