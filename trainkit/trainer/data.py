"""Between a dataset and the model: label names, dropping unused keys, default collators, calling the model,
counting loss items.

Batches may be dicts (transformers style) or tuples/lists (plain nn.Module style); the DataLoaders themselves
are built in :mod:`.loaders`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Columns transformers' collators turn into "labels"; kept even though no forward names them.
LABEL_COLUMN_ALIASES = ("label", "label_ids")


def forward_parameter_names(model: nn.Module) -> list[str]:
    """The keyword names ``model.forward`` takes (empty when it only takes ``*args``/``**kwargs``)."""
    parameters = inspect.signature(model.forward).parameters
    return [name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def default_label_names(model: nn.Module) -> list[str]:
    """Label argument names of the model's forward (transformers' convention), 'labels' by default."""
    names = [n for n in forward_parameter_names(model) if "label" in n]
    if type(model).__name__.endswith("ForQuestionAnswering"):
        names = ["start_positions", "end_positions"]
    return names or ["labels"]


class UnusedColumnsDropper:
    """A collator that first drops the keys of dict examples the model does not take (datasets whose columns are
    not known up front: torch datasets of dicts, streams)."""

    def __init__(self, collate_fn: Any, accepted: set[str], description: str) -> None:
        self.collate_fn = collate_fn
        self.accepted = accepted
        self.description = description

    def __call__(self, features: list[Any]) -> Any:
        if features and isinstance(features[0], Mapping):
            kept = [{k: v for k, v in feature.items() if k in self.accepted} for feature in features]
            if not kept[0]:
                raise ValueError(
                    f"{self.description}: no column is left after dropping those the model's forward does not take "
                    f"(the examples have {sorted(features[0])}). Rename them to the forward's argument names or pass "
                    "remove_unused_columns=False.")
            features = kept
        return self.collate_fn(features)


def default_collator(processing_class: Any):
    """transformers' DataCollatorWithPadding for a tokenizer, else a collator for dicts or tuples."""
    if processing_class is not None and hasattr(processing_class, "pad"):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(processing_class)
    return collate_any


def collate_any(features: list[Any]) -> Any:
    """Dict features as transformers' default_data_collator collates them ('label' -> 'labels'); others through
    torch's ``default_collate``. Dicts of tensors only (no 'label'/'label_ids') are stacked here, key by key, which
    is all that collator does with them; any other dict goes to it (a plain ``nn.Module`` run need not import
    transformers for tensors: ~0.3 s of start-up)."""
    if features and isinstance(features[0], Mapping):
        first = features[0]
        if all(isinstance(value, torch.Tensor) for value in first.values()) and not {"label", "label_ids"} & set(first):
            return {key: torch.stack([feature[key] for feature in features]) for key in first}
        from transformers.data.data_collator import default_data_collator

        return default_data_collator(features)
    return torch.utils.data.default_collate(features)


def call_model(model: nn.Module, inputs: Any, **extra: Any) -> Any:
    """Call ``model`` with a dict batch as keywords, a tuple/list batch as positions, anything else as one argument."""
    if isinstance(inputs, Mapping):
        return model(**inputs, **extra)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs, **extra)
    return model(inputs, **extra)


def loss_from_outputs(outputs: Any) -> torch.Tensor:
    """The loss in a model's outputs: ``outputs['loss']``, the first item of a tuple, or a scalar tensor itself."""
    if isinstance(outputs, Mapping) or hasattr(outputs, "keys"):
        if "loss" not in outputs or outputs["loss"] is None:
            raise ValueError(
                f"The model returned {list(outputs.keys())} without a 'loss'. Pass labels in the batch (see "
                "label_names), a compute_loss_func, or override Trainer.compute_loss."
            )
        return outputs["loss"]
    if isinstance(outputs, (list, tuple)):
        return outputs[0]
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return outputs
    raise ValueError(f"Cannot find a loss in the model's output of type {type(outputs).__name__}.")


def split_loss(outputs: Any, ignore_keys: list[str]) -> tuple[torch.Tensor | None, Any]:
    """(loss or None, predictions) from a model's outputs; predictions leave out ``ignore_keys``, a single one unwrapped.

    A dict's loss is its 'loss'; a tuple's is its first item when that is a scalar; a lone scalar is a loss.
    """
    loss = None
    if isinstance(outputs, Mapping) or hasattr(outputs, "keys"):
        loss = outputs.get("loss")
        kept = tuple(v for k, v in outputs.items() if k != "loss" and k not in ignore_keys and v is not None)
    elif isinstance(outputs, (list, tuple)):
        kept = tuple(outputs)
        if kept and isinstance(kept[0], torch.Tensor) and kept[0].ndim == 0:
            loss, kept = kept[0], kept[1:]
    elif isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
        return outputs, None
    else:
        return None, outputs
    return loss, (kept[0] if len(kept) == 1 else (kept or None))


class ItemCounter:
    """Counts the items a micro-batch's mean loss averages over: valid tokens for token-level labels, else samples.

    A causal LM's loss shifts its labels by one, so position 0 is never a target and is not counted. (For a loss
    divided by ``num_items_in_batch`` the count is transformers' own: trainer/loss_items.py.)
    """

    def __init__(self, model: nn.Module, label_names: list[str]) -> None:
        self.label_name = label_names[0] if len(label_names) == 1 else None
        loss_type = str(getattr(model, "loss_type", "") or "")
        config = getattr(model, "config", None)
        self.shifts_labels = (
            ("ForCausalLM" in loss_type or type(model).__name__.endswith("ForCausalLM"))
            and not getattr(config, "is_encoder_decoder", False)
        )

    def __call__(self, inputs: Any) -> torch.Tensor | int:
        """Item count of one micro-batch: a tensor for tokens (no host sync), an int for samples."""
        labels = inputs.get(self.label_name) if isinstance(inputs, Mapping) and self.label_name else None
        if isinstance(inputs, Mapping) and "shift_labels" in inputs:
            labels = inputs["shift_labels"]
        elif labels is not None and self.shifts_labels:
            labels = labels[..., 1:]
        if isinstance(labels, torch.Tensor) and labels.ndim >= 2 and not labels.is_floating_point():
            return labels.ne(-100).sum()
        return samples_in(inputs)


def samples_in(inputs: Any) -> int:
    """Number of samples in a batch (the first dimension of its first tensor)."""
    values = inputs.values() if isinstance(inputs, Mapping) else inputs if isinstance(inputs, (list, tuple)) else [inputs]
    for value in values:
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    return 1


def tokens_in(inputs: Any, main_input_name: str, non_padding: bool) -> int | torch.Tensor:
    """Input tokens of a batch: all positions of the main input, or only those the attention mask keeps."""
    if not isinstance(inputs, Mapping):
        return 0
    if non_padding and isinstance(inputs.get("attention_mask"), torch.Tensor):
        return inputs["attention_mask"].sum()
    main = inputs.get(main_input_name)
    return main.numel() if isinstance(main, torch.Tensor) else 0

