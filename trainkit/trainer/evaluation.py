"""Evaluation and prediction: run the model over a dataset on every process and gather exact results.

Every batch's loss, predictions and labels are gathered with ``gather_for_metrics``, which drops the samples
the sampler repeated to even out the processes, so N samples give exactly N rows, in dataset order.
Tensors of different sequence lengths are padded with -100 (across processes and across batches).
With ``eval_accumulation_steps`` the gathered rows move to host memory every that many batches, which
bounds device memory; without it they stay on the device until the end, as in transformers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import torch

from trainkit.engine.process.nested import map_tensors

if TYPE_CHECKING:
    from torch import nn

    from trainkit.engine.accelerator import Accelerator

    from .arguments import TrainingArguments
    from .callbacks import CallbackHandler, TrainerControl, TrainerState

logger = logging.getLogger(__name__)


class EvaluatedTrainer(Protocol):
    """What :func:`evaluation_loop` uses of a Trainer (typed structurally: trainer.py imports this module)."""

    args: TrainingArguments
    accelerator: Accelerator
    model_wrapped: nn.Module
    callback_handler: CallbackHandler
    state: TrainerState
    control: TrainerControl
    compute_metrics: Callable[..., dict[str, Any]] | None
    """Called with an EvalPrediction (and ``compute_result=`` under batch_eval_metrics)."""
    preprocess_logits_for_metrics: Callable[[Any, Any], Any] | None

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, predictions, labels) of one batch, without gradients."""
        ...

PAD_INDEX = -100


class EvalPrediction:
    """What ``compute_metrics`` receives: predictions, label_ids and, on request, inputs and losses.

    Unpacks like a tuple: ``predictions, labels = eval_prediction``.
    """

    def __init__(self, predictions, label_ids, inputs=None, losses=None) -> None:
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self._items = (predictions, label_ids) + tuple(x for x in (inputs, losses) if x is not None)

    def __iter__(self):
        return iter(self._items)

    def __getitem__(self, index: int):
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


class EvalLoopOutput(NamedTuple):
    """Gathered results of one evaluation or prediction pass."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    """What ``Trainer.predict`` returns: ``predictions, label_ids, metrics = trainer.predict(ds)``."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


def _pad_and_concat(first, second):
    """Concatenate on dim 0, padding dim 1 with -100 when sequence lengths differ (nested structures too)."""
    if first is None:
        return second
    if isinstance(first, (list, tuple)):
        return type(first)(_pad_and_concat(a, b) for a, b in zip(first, second))
    if isinstance(first, Mapping):
        return type(first)({k: _pad_and_concat(first[k], second[k]) for k in first})
    if isinstance(first, np.ndarray):
        first_t, second_t = torch.from_numpy(first), torch.from_numpy(second)
        return _pad_and_concat(first_t, second_t).numpy()
    if first.ndim < 2 or first.shape[1:] == second.shape[1:]:
        return torch.cat((first, second.to(first.device)), dim=0)
    shape = (first.shape[0] + second.shape[0], max(first.shape[1], second.shape[1])) + tuple(first.shape[2:])
    result = first.new_full(shape, PAD_INDEX)
    result[: first.shape[0], : first.shape[1]] = first
    result[first.shape[0] :, : second.shape[1]] = second.to(first.device)
    return result


def _to_numpy(data):
    def convert(tensor: torch.Tensor):
        tensor = tensor.detach().cpu()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()  # numpy has no bfloat16
        return tensor.numpy()

    return map_tensors(convert, data)


class _GatheredResults:
    """Accumulates gathered per-batch results; spills to host memory every ``spill_every`` batches."""

    def __init__(self, spill_every: int | None, concat: bool = True, objects: bool = False) -> None:
        self.spill_every = spill_every
        self.concat = concat  # False (eval_do_concat_batches=False): one host entry per batch, in a list
        self.objects = objects  # eval_use_gather_object: values are per-sample lists, kept as one flat list
        self.on_device: dict[str, Any] = {}
        self.on_host: dict[str, Any] = {}
        self.batches_since_spill = 0

    def add(self, name: str, value) -> None:
        if value is None:
            return
        if self.objects:
            self.on_host.setdefault(name, []).extend(_to_numpy(v) if isinstance(v, torch.Tensor) else v for v in value)
            return
        if not self.concat:
            self.on_host.setdefault(name, []).append(_to_numpy(value) if _all_tensors(value) else value)
            return
        self.on_device[name] = _pad_and_concat(self.on_device.get(name), value)

    def end_batch(self) -> None:
        self.batches_since_spill += 1
        if self.spill_every is not None and self.batches_since_spill >= self.spill_every:
            self.spill()

    def spill(self) -> None:
        for name, value in self.on_device.items():
            self.on_host[name] = _pad_and_concat(self.on_host.get(name), _to_numpy(value))
        self.on_device = {}
        self.batches_since_spill = 0

    def result(self, name: str):
        self.spill()
        return self.on_host.get(name)


def _all_tensors(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_all_tensors(v) for v in value)
    if isinstance(value, Mapping):
        return all(_all_tensors(v) for v in value.values())
    return isinstance(value, torch.Tensor)


def _batch_size(inputs) -> int | None:
    for value in (inputs.values() if isinstance(inputs, Mapping) else inputs if isinstance(inputs, (list, tuple)) else [inputs]):
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return value.shape[0]
    return None


def evaluation_loop(trainer: EvaluatedTrainer, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                    ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
    """Run ``trainer.prediction_step`` over ``dataloader`` (already prepared) and gather exact results."""
    args, accelerator = trainer.args, trainer.accelerator
    prediction_loss_only = args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
    model = trainer.model_wrapped
    model.eval()
    optimizer_eval = getattr(getattr(trainer, "optimizer", None), "eval", None)
    if callable(optimizer_eval):  # schedule-free optimizers: evaluate their averaged weights
        optimizer_eval()
    logger.debug("Running %s", description)
    trainer.callback_handler.eval_dataloader = dataloader
    results = _GatheredResults(args.eval_accumulation_steps, concat=args.eval_do_concat_batches,
                               objects=args.eval_use_gather_object)
    wants_inputs = "inputs" in args.include_for_metrics
    gather: Callable[[Any], Any] = accelerator.gather_for_metrics
    if args.eval_use_gather_object:
        def gather(data: Any) -> Any:  # one object per sample, gathered as Python objects (strings, ragged structures, ...)
            samples = list(data) if isinstance(data, (torch.Tensor, list, tuple)) else [data]
            return accelerator.gather_for_metrics(samples, use_gather_object=True)
    batch_metrics = args.batch_eval_metrics and trainer.compute_metrics is not None and not prediction_loss_only
    metrics: dict[str, Any] = {}
    for inputs in dataloader:
        loss, logits, labels = trainer.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if loss is not None:
            batch_size = _batch_size(inputs) or 1
            results.add("losses", gather(loss.detach().reshape(1).repeat(batch_size)))
        if wants_inputs and isinstance(inputs, Mapping):
            main_input = inputs.get(getattr(trainer, "main_input_name", "input_ids"))
            if main_input is not None:
                main_input = accelerator.pad_across_processes(main_input, dim=1, pad_index=PAD_INDEX)
                results.add("inputs", gather(main_input))
        if labels is not None:
            labels = accelerator.pad_across_processes(labels, dim=1, pad_index=PAD_INDEX)
        if logits is not None:
            logits = accelerator.pad_across_processes(logits, dim=1, pad_index=PAD_INDEX)
            if trainer.preprocess_logits_for_metrics is not None:
                logits = trainer.preprocess_logits_for_metrics(logits, labels)
            logits = gather(logits)
        if labels is not None:
            labels = gather(labels)
        if batch_metrics and trainer.compute_metrics is not None:  # the metric accumulates itself; keep the losses
            if logits is not None and labels is not None:
                is_last = accelerator.gradient_state.end_of_dataloader  # set by the prepared loader on its last batch
                metrics = dict(trainer.compute_metrics(EvalPrediction(logits, labels), compute_result=is_last) or {})
        if not batch_metrics or description == "Prediction":  # predict() returns them under batch metrics too
            results.add("predictions", logits)
            results.add("labels", labels)
        results.end_batch()
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)

    losses, predictions = results.result("losses"), results.result("predictions")
    label_ids, gathered_inputs = results.result("labels"), results.result("inputs")
    if not batch_metrics and trainer.compute_metrics is not None and predictions is not None and label_ids is not None:
        prediction = EvalPrediction(
            predictions, label_ids,
            inputs=gathered_inputs if wants_inputs else None,
            losses=losses if "loss" in args.include_for_metrics else None,
        )
        metrics = dict(trainer.compute_metrics(prediction) or {})
    metrics = {k: _plain_number(v) for k, v in metrics.items()}
    if losses is not None and len(losses):
        metrics[f"{metric_key_prefix}_loss"] = float(np.mean(np.concatenate([np.atleast_1d(x) for x in losses]) if isinstance(losses, list) else losses))
    metrics = {k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": v for k, v in metrics.items()}
    num_samples = _count_samples(predictions, label_ids, losses, args)
    return EvalLoopOutput(predictions=predictions, label_ids=label_ids, metrics=metrics, num_samples=num_samples)


def _count_samples(predictions, label_ids, losses, args) -> int | None:
    if args.eval_use_gather_object:  # flat per-sample lists
        return len(losses) if losses is not None else len(predictions) if predictions is not None else None
    if not args.eval_do_concat_batches:  # one array per batch
        return sum(len(batch) for batch in losses) if losses else None
    return _num_rows(predictions, label_ids, losses)


def _num_rows(*candidates) -> int | None:
    for value in candidates:
        while isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, np.ndarray) and value.ndim > 0:
            return int(value.shape[0])
    return None


def _plain_number(value):
    # compute_metrics often returns numpy scalars; JSON logs and trackers want Python numbers.
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def speed_metrics(prefix: str, start_time: float, num_samples: int | None = None, num_steps: int | None = None,
                  num_tokens: float | None = None) -> dict[str, float]:
    """``{prefix}_runtime``, ``_samples_per_second``, ``_steps_per_second`` and ``_tokens_per_second`` since
    ``start_time`` (a ``time.perf_counter()``)."""
    runtime = time.perf_counter() - start_time
    metrics = {f"{prefix}_runtime": round(runtime, 4)}
    if runtime > 0:
        for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
            if count is not None:
                metrics[f"{prefix}_{name}_per_second"] = round(count / runtime, 3)
    return metrics
