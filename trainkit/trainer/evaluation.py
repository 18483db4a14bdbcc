"""Evaluation and prediction: run the model over a dataset on every process and gather exact results; the
Trainer's evaluation hooks (:class:`EvaluationMethods`: ``evaluate``, ``_evaluate``, ``_determine_best_metric``,
``evaluation_loop``, ``predict``, ``prediction_step``).

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
from torch import nn

from trainkit.engine import map_tensors

from . import loss_items
from .data import call_model, split_loss
from .plan import length_or_none

if TYPE_CHECKING:
    from trainkit.engine import Accelerator

    from .training_arguments.arguments import TrainingArguments
    from .callbacks import CallbackHandler, TrainerControl, TrainerState

# a Trainer mixin's messages are the Trainer's: one logger for them all, as transformers' come from transformers.trainer
logger = logging.getLogger("trainkit.trainer.trainer")


class EvaluatedTrainer(Protocol):
    """What :func:`evaluation_loop` uses of a Trainer (typed structurally: trainer.py imports this module)."""

    args: TrainingArguments
    accelerator: Accelerator
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
                    ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval", *,
                    model: nn.Module) -> EvalLoopOutput:
    """Run ``trainer.prediction_step`` with ``model`` over ``dataloader`` (both prepared) and gather exact results."""
    args, accelerator = trainer.args, trainer.accelerator
    prediction_loss_only = args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
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


def speed_metrics(prefix: str, start_time: float, num_samples: float | None = None, num_steps: int | None = None,
                  num_tokens: float | None = None) -> dict[str, float]:
    """``{prefix}_runtime``, ``_samples_per_second``, ``_steps_per_second`` and ``_tokens_per_second`` since
    ``start_time`` (a ``time.time()``, as transformers' ``Trainer.log(logs, start_time)`` takes it)."""
    runtime = time.time() - start_time
    metrics = {f"{prefix}_runtime": round(runtime, 4)}
    if runtime > 0:
        for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
            if count is not None:
                metrics[f"{prefix}_{name}_per_second"] = round(count / runtime, 3)
    return metrics


class EvaluationMethods:
    """transformers' evaluation and prediction hooks (mixed into :class:`~trainkit.Trainer`)."""

    if TYPE_CHECKING:
        args: TrainingArguments
        accelerator: Accelerator
        callback_handler: CallbackHandler
        state: TrainerState
        control: TrainerControl
        compute_metrics: Callable[..., dict[str, Any]] | None
        preprocess_logits_for_metrics: Callable[[Any, Any], Any] | None
        model: nn.Module
        model_wrapped: nn.Module
        eval_dataset: Any
        label_names: list[str]
        lr_scheduler: Any
        is_in_train: bool
        _memory_tracker: Any

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any: ...
        def get_test_dataloader(self, test_dataset: Any) -> Any: ...
        def num_examples(self, dataloader: Any) -> int: ...
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...
        def compute_loss(self, model: nn.Module, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: torch.Tensor | int | None = None) -> Any: ...
        def compute_loss_context_manager(self) -> Any: ...
        def _prepare_inputs(self, inputs: Any) -> Any: ...
        def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device) -> Any: ...
        def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module: ...
        def _prepare_model(self, model: nn.Module | None = None) -> None: ...
        def _scheduler_needs_metrics(self) -> bool: ...
        def _report_to_hp_search(self, trial: Any, step: int, metrics: dict[str, float]) -> None: ...
        _trial: Any

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Loss and ``compute_metrics`` over the evaluation set (each of a dict of them, keys prefixed by its
        name), gathered exactly; keys start with ``eval_``."""
        override = eval_dataset is not None
        dataset = eval_dataset if override else self.eval_dataset
        if isinstance(dataset, Mapping):
            metrics: dict[str, float] = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(eval_dataset=part if override else name, ignore_keys=ignore_keys,
                                             metric_key_prefix=f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start()
        dataloader = self.get_eval_dataloader(dataset)
        start = time.time()
        output = self.evaluation_loop(dataloader, description="Evaluation",
                                      prediction_loss_only=True if self.compute_metrics is None else None,
                                      ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics = dict(output.metrics or {})
        metrics.update(speed_metrics(metric_key_prefix, start, output.num_samples, length_or_none(dataloader)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        if not self.is_in_train:
            self._close_trackers()
        return metrics

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None,
                  skip_scheduler: bool = False) -> dict[str, float]:
        """An evaluation during training: ``evaluate()``, then a ReduceLROnPlateau schedule steps on
        ``metric_for_best_model`` (unless ``skip_scheduler``) and the model goes back to training mode."""
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        self._report_to_hp_search(self._trial, self.state.global_step, metrics)  # may prune the trial
        name = self.args.metric_for_best_model
        if self._scheduler_needs_metrics() and not skip_scheduler and name is not None:
            self.lr_scheduler.step(metrics[_metric_key(name, metrics)])
        self.model_wrapped.train()
        return metrics

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool:
        """Whether ``metrics`` hold a new best ``metric_for_best_model``; records it in ``state.best_metric`` (and
        the step in ``best_global_step`` when checkpoints are saved)."""
        name = self.args.metric_for_best_model
        if name is None:
            return False
        value, best = metrics[_metric_key(name, metrics)], self.state.best_metric
        if best is not None and not (value > best if self.args.greater_is_better else value < best):
            return False
        self.state.best_metric = value
        if self.args.save_strategy in ("steps", "epoch", "best"):
            self.state.best_global_step = self.state.global_step
        return True

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Predictions, labels, loss and ``compute_metrics`` over ``dataloader`` (from ``get_eval_dataloader`` or
        ``get_test_dataloader``), gathered exactly. ``evaluate``/``predict`` go through it; subclasses such as
        the example scripts' ``QuestionAnsweringTrainer`` call it directly, so it prepares the model itself."""
        model = self._wrap_model(self.model, training=False)
        self._prepare_model(model)
        if model is self.model:
            model = self.model_wrapped
        _cast_for_full_eval(self, model)
        if length_or_none(dataloader) is not None:
            logger.debug("%s: %d examples", description, self.num_examples(dataloader))
        return evaluation_loop(self, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix,
                               model=model)

    def _close_trackers(self) -> None:
        """After an evaluate() outside train(): its log restarted the trackers; close them (no file left open)."""
        from .callbacks import TrackerCallback

        for callback in self.callback_handler.engine_callbacks:
            if isinstance(callback, TrackerCallback) and callback.started:
                callback.on_train_end(self.args, self.state, self.control)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions, label ids (when the data has labels) and metrics, one row per sample in dataset order."""
        self._memory_tracker.start()
        dataloader = self.get_test_dataloader(test_dataset)
        start = time.time()
        output = self.evaluation_loop(dataloader, description="Prediction", ignore_keys=ignore_keys,
                                      metric_key_prefix=metric_key_prefix)
        metrics = dict(output.metrics or {})
        metrics.update(speed_metrics(metric_key_prefix, start, output.num_samples, length_or_none(dataloader)))
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, predictions, labels) of one batch, without gradients."""
        is_dict = isinstance(inputs, Mapping)
        has_labels = is_dict and bool(self.label_names) and all(inputs.get(name) is not None for name in self.label_names)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:  # transformers' default: the model's cache output (named "cache" from 5.24 on)
            config = getattr(self.model, "config", None)
            ignore_keys = [] if config is None else list(getattr(config, "keys_to_ignore_at_inference",
                                                                 ["past_key_values", "cache"]))
        labels = None
        if has_labels:
            labels = tuple(inputs[name].detach() for name in self.label_names)
            labels = labels[0] if len(labels) == 1 else labels
        with torch.no_grad():
            if has_labels:
                num_items = loss_items.evaluation_items(self, inputs)  # as transformers counts them
                with self.compute_loss_context_manager():
                    loss, outputs = self.compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items)
                loss = loss_items.evaluation_loss(self, loss, num_items)
                _, predictions = split_loss(outputs, ignore_keys)
            else:
                with self.compute_loss_context_manager():
                    loss, predictions = split_loss(call_model(model, inputs), ignore_keys)
        loss = loss.detach().mean() if loss is not None else None
        if prediction_loss_only:
            return loss, None, None
        return loss, predictions, labels


def _metric_key(name: str, metrics: dict[str, float]) -> str:
    """``metric_for_best_model``'s key in the evaluation metrics (``eval_`` added); absent is an error naming them."""
    key = name if name.startswith("eval_") else f"eval_{name}"
    if key not in metrics:
        raise KeyError(f"metric_for_best_model={name!r}: no {key!r} among the evaluation metrics {sorted(metrics)}.")
    return key


def _cast_for_full_eval(trainer: Any, model: nn.Module) -> None:
    """bf16_full_eval / fp16_full_eval: outside training, evaluate with the model itself in that dtype (as
    transformers; during training, evaluations keep the training precision)."""
    args = trainer.args
    if not trainer.is_in_train and (args.bf16_full_eval or args.fp16_full_eval):
        model.to(dtype=torch.bfloat16 if args.bf16_full_eval else torch.float16)
