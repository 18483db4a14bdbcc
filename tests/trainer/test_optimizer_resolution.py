"""The Trainer resolves ``optim`` names and weight-decay groups as transformers' own ``Trainer`` does (CPU only; a
plain module's run without transformers at all: test_built_here.py).

The oracle is the installed transformers: ``Trainer.get_optimizer_cls_and_kwargs`` and
``Trainer.get_decay_parameter_names`` are called side by side with trainkit's resolution for every name.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Trainer as TransformersTrainer

from trainkit import TrainingArguments
from trainkit.trainer import optim


class Blocks(nn.Module):
    """Parameter names of every kind the decay rule looks at."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.layer_norm = nn.LayerNorm(4)
        self.proj = nn.Linear(4, 4)
        self.final_norm = nn.Module()
        self.final_norm.weight = nn.Parameter(torch.ones(4))
        self.rmsnorm_scale = nn.Parameter(torch.ones(4))
        self.head = nn.Linear(4, 2, bias=False)


def _outcome(resolve):
    try:
        cls, kwargs = resolve()
    except Exception as error:  # noqa: BLE001 - the error itself is compared
        return ("error", type(error).__name__, str(error))
    return ("ok", cls, {key: (type(value).__name__ if key == "optimizer_dict" else value) for key, value in kwargs.items()})


@pytest.mark.parametrize("name", optim.optimizer_names())
def test_every_name_resolves_as_transformers_trainer_does(name, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", optim="sgd",
                             learning_rate=3e-4, adam_beta1=0.8, adam_epsilon=1e-7)
    args.optim, args.optim_args = name, None  # every name, even those this machine refuses at construction
    model = Blocks()
    view = optim._ResolverArguments(args, None)
    ours = _outcome(lambda: optim._resolve(view, model))
    theirs = _outcome(lambda: TransformersTrainer.get_optimizer_cls_and_kwargs(view, model))
    assert ours == theirs


def test_decay_groups_are_transformers_trainers():
    from transformers import BertConfig, BertForSequenceClassification

    bert = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=8))
    for model in (Blocks(), bert):
        ours = optim.decay_parameter_names(model)
        assert ours == TransformersTrainer.get_decay_parameter_names(None, model)
        assert 0 < len(ours) < len(list(model.parameters()))  # some excluded, some kept: the rule was exercised
