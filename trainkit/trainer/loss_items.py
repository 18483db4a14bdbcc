"""The items a window's loss is a mean over (``num_items_in_batch``), counted and handed to the model as transformers does.

transformers counts a window's loss items when its batches have ``labels`` and the model takes loss keyword
arguments (``accepts_loss_kwargs``, else a ``**kwargs`` forward) or a ``compute_loss_func`` is given: the labels
that are not -100, over the window's micro-batches, summed over all processes with ``average_tokens_across_devices``.
From transformers 5.10 the count of a model whose loss is the causal-LM loss (its ``loss_type`` maps to
``ForCausalLMLoss``; encoder-decoders excepted) leaves out each row's first label, which that loss never predicts
(a ``shift_labels`` entry is counted as it is); 5.1 to 5.9 count every label, so the loss reads (L-1)/L of the mean
over predicted tokens. The count goes to the model, whose loss (transformers' loss functions) is then the window's
sum over it; each evaluation batch is counted and passed the same way.

The Trainer counts and passes exactly that, so a model whose loss divides by the count gives transformers' numbers
to the bit. A model that takes ``**kwargs`` but never looks at the count (BERT's heads compute their own mean) gets
it too, and the Trainer weights its mean by its share of the window's items, where transformers would take that
mean as already scaled: multiplied by the accumulation steps and the processes (see :func:`loss_uses_num_items`).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .training_arguments.fields import installed_transformers_release

if TYPE_CHECKING:
    from trainkit.trainer.training_arguments.arguments import TrainingArguments

SHIFTED_CAUSAL_COUNT_SINCE = (5, 10)
"""The first transformers release whose count leaves out each causal-LM row's first label."""


def _peeled(model: nn.Module) -> nn.Module:
    """The model under a PEFT wrapper (transformers inspects the base model's class)."""
    base = getattr(model, "base_model", None)
    inner = getattr(base, "model", None)
    return inner if isinstance(inner, nn.Module) and type(model).__name__.startswith("Peft") else model


def model_accepts_loss_kwargs(model: nn.Module) -> bool:
    """transformers' rule: the model's ``accepts_loss_kwargs`` attribute, else whether its forward takes ``**kwargs``."""
    explicit = getattr(model, "accepts_loss_kwargs", None)
    if explicit is not None:
        return bool(explicit)
    parameters = inspect.signature(model.forward).parameters.values()
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)


def loss_uses_num_items(model: nn.Module) -> bool:
    """Whether the model's loss divides by ``num_items_in_batch`` (so it is already the window's share).

    An explicit ``accepts_loss_kwargs`` says so; otherwise the forward must take ``**kwargs`` and hand them to
    transformers' ``loss_function`` or read ``num_items_in_batch`` itself. BERT's heads (5.24) take ``**kwargs``
    but compute their own mean with ``CrossEntropyLoss``: their mean is weighted by the Trainer instead.
    """
    model = _peeled(model)
    explicit = getattr(model, "accepts_loss_kwargs", None)
    if explicit is not None:
        return bool(explicit)
    if not model_accepts_loss_kwargs(model):
        return False
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):  # no source to read (built at run time): trust the signature, as transformers does
        return True
    return "loss_function" in source or "num_items_in_batch" in source


def loss_shifts_labels(model: nn.Module) -> bool:
    """Whether transformers leaves each row's first label out of the count (see the module doc)."""
    model = _peeled(model)
    loss_type = getattr(model, "loss_type", None)
    if loss_type is None or installed_transformers_release() < SHIFTED_CAUSAL_COUNT_SINCE:
        return False  # no transformers loss type (a plain nn.Module): nothing to import to know it
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    causal = LOSS_MAPPING.get(loss_type) is ForCausalLMLoss
    return causal and not getattr(getattr(model, "config", None), "is_encoder_decoder", False)


def count_label_items(batches: Sequence[Any], shifts_labels: bool) -> torch.Tensor | None:
    """The labels that are not -100 in ``batches`` (transformers' count), or None when they cannot be counted."""
    if not batches or not isinstance(batches[0], Mapping) or "labels" not in batches[0]:
        return None
    try:
        counts = [batch["shift_labels"] if "shift_labels" in batch
                  else batch["labels"][..., 1:] if shifts_labels else batch["labels"] for batch in batches]
        return sum(labels.ne(-100).sum() for labels in counts)  # type: ignore[return-value]  # sum() of tensors is a tensor
    except (TypeError, AttributeError):
        return None


def num_items_in_batch(trainer: Any, batch_samples: Sequence[Any], device: torch.device | None) -> torch.Tensor | None:
    """A window's ``num_items_in_batch`` as transformers' Trainer computes it (see the module doc): None unless the
    model takes loss keyword arguments or a ``compute_loss_func`` is given; summed over the data-parallel processes
    with ``average_tokens_across_devices``."""
    if not (trainer.model_accepts_loss_kwargs or trainer.compute_loss_func is not None):
        return None
    count = count_label_items(batch_samples, trainer._loss_shifts_labels)
    if count is None:
        return None
    accelerator = trainer.accelerator
    count = count.to(accelerator.device)
    if trainer.args.average_tokens_across_devices and accelerator.num_processes > 1:
        count = accelerator.reduce(count, reduction="sum")
        copies = accelerator.num_processes // accelerator.strategy.data_parallel_size
        if copies > 1:  # tensor-parallel ranks read the same batch: transformers divides by their number
            count = count / copies
    return count.to(device) if device is not None else count


def loss_is_window_share(trainer: Any, count: torch.Tensor | int | None) -> bool:
    """Whether the window's losses come divided by ``count`` (the Trainer then leaves them as they are): the
    Trainer's ``loss_is_scaled_for_ga`` when set, else with a ``compute_loss_func``, a label smoother that takes the
    count, or a model whose loss uses it (:func:`loss_uses_num_items`)."""
    if trainer.loss_is_scaled_for_ga is not None:
        return bool(trainer.loss_is_scaled_for_ga)
    if trainer.compute_loss_func is not None:
        return True
    if count is None:
        return False
    if trainer.args.label_smoothing_factor:
        from transformers.trainer_pt_utils import LabelSmoother

        return "num_items_in_batch" in inspect.signature(LabelSmoother.__call__).parameters
    return bool(trainer._loss_uses_num_items)


def evaluation_items(trainer: Any, inputs: Any) -> torch.Tensor | None:
    """An evaluation batch's count, as transformers' ``prediction_step`` takes it (summed over processes), or None
    where processes may evaluate different numbers of batches (``even_batches=False``: a sum would wait forever)."""
    accelerator = trainer.accelerator
    if accelerator.num_processes > 1 and not accelerator.even_batches:
        return None
    return trainer._get_num_items_in_batch([inputs], trainer.args.device)


def evaluation_loss(trainer: Any, loss: torch.Tensor, count: torch.Tensor | None) -> torch.Tensor:
    """An evaluation batch's loss as this process's mean: a loss divided by a count over all processes is multiplied
    by their number (transformers' ``compute_loss``), so that the evaluation loop's mean over processes is the
    batch's mean."""
    accelerator = trainer.accelerator
    processes = accelerator.strategy.data_parallel_size
    if (count is None or processes == 1 or not trainer.args.average_tokens_across_devices
            or not loss_is_window_share(trainer, count)):
        return loss
    return loss * processes


def set_policy(trainer: Any, model: nn.Module) -> None:
    """Decide, for ``model``, what transformers' Trainer decides at construction: ``model_accepts_loss_kwargs`` and its
    counting rule; and whether the model's loss uses the count (:func:`loss_uses_num_items`)."""
    trainer.model_accepts_loss_kwargs = model_accepts_loss_kwargs(model)
    trainer._loss_uses_num_items = loss_uses_num_items(model)
    trainer._loss_shifts_labels = loss_shifts_labels(model)
    trainer._window_loss_is_share = False
    trainer.current_gradient_accumulation_steps = 1  # transformers' attribute: micro-batches in the current window


def open_window(trainer: Any, window: Sequence[Any], count: torch.Tensor | int | None) -> bool:
    """Open the engine's accumulation window over ``window`` with its items on all processes; return whether its
    losses come as shares of ``count`` (:func:`loss_is_window_share`) rather than means to weight."""
    accelerator, average = trainer.accelerator, trainer.args.average_tokens_across_devices
    is_share = loss_is_window_share(trainer, count)
    if is_share and count is not None:  # the window's items are the count (each process's own, without averaging)
        accelerator.open_accumulation_window(len(window), count, items_are_global=average,
                                             same_items_on_every_process=not average)
        return True
    items = sum(trainer._count_items(inputs) for inputs in window)
    fixed_batches = getattr(trainer.callback_handler.train_dataloader, "global_batch_size", None) is not None
    # Every rank's batches have one size: the sample count is the same everywhere, no collective needed.
    # average_tokens_across_devices=False (transformers' meaning): each process normalises by its own items,
    # so the gradient is the mean of the processes' mean losses; taken as local items x processes, unsummed.
    same_everywhere = isinstance(items, int) and fixed_batches and accelerator.even_batches
    accelerator.open_accumulation_window(len(window), items, same_items_on_every_process=same_everywhere or not average)
    return is_share


def window_share(trainer: Any, loss: torch.Tensor, inputs: Any, count: torch.Tensor | int | None) -> torch.Tensor:
    """A micro-batch's loss as its share of the window's loss on all processes: a loss divided by ``count`` already is
    (times 1, or 1/processes when each process counted its own); a mean over the micro-batch's own items is weighted
    by its share of the window's items; without counted items, by the window's micro-batches (transformers' rule)."""
    window_items = trainer.accelerator.gradient_state.window_items
    if trainer._window_loss_is_share:
        return loss * (count / window_items) if count is not None and window_items is not None else loss
    if window_items is None:
        return loss / trainer.current_gradient_accumulation_steps
    return loss * (trainer._count_items(inputs) / window_items)


def label_smoother(args: TrainingArguments, model: nn.Module) -> Any:
    """``Trainer.label_smoother``: transformers' LabelSmoother for ``label_smoothing_factor``, else None. A model
    configured for multi-label classification (independent sigmoid targets) gets none, with a warning, as in
    transformers: smoothing a softmax over classes does not apply to it."""
    if not args.label_smoothing_factor:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        warnings.warn(f"label_smoothing_factor={args.label_smoothing_factor} is not applied: Label smoothing is not "
                      "compatible with multi-label classification (config.problem_type).", UserWarning, stacklevel=3)
        return None
    from transformers.trainer_pt_utils import LabelSmoother

    return LabelSmoother(epsilon=args.label_smoothing_factor)


def label_smoothed_loss(trainer: Any, model: nn.Module, inputs: Mapping[str, Any], num_items_in_batch: Any = None,
                        model_kwargs: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, Any]:
    """(loss, outputs) with ``trainer.label_smoother``: labels are withheld from the model, and shifted by one
    for causal language models, as transformers does; the smoother divides by ``num_items_in_batch`` where the
    installed release's takes it (5.17 and later)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .data import call_model

    label_name = trainer.label_names[0]
    labels = inputs[label_name]
    outputs = call_model(model, {k: v for k, v in inputs.items() if k != label_name}, **(model_kwargs or {}))
    unwrapped = trainer.accelerator.unwrap_model(model)
    causal = unwrapped._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if hasattr(unwrapped, "_get_name") else False
    smoother = trainer.label_smoother
    if num_items_in_batch is not None and "num_items_in_batch" in inspect.signature(smoother.__call__).parameters:
        return smoother(outputs, labels, shift_labels=causal, num_items_in_batch=num_items_in_batch), outputs
    return smoother(outputs, labels, shift_labels=causal), outputs
