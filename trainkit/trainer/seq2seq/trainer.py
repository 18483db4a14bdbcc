"""Seq2SeqTrainer: the Trainer with transformers' generation in ``evaluate``/``predict`` (``predict_with_generate``).

Which ``generate`` settings apply is resolved as transformers resolves them: keywords given to ``evaluate`` /
``predict`` (or to ``prediction_step``) > ``generation_max_length`` / ``generation_num_beams`` > the model's
``generation_config`` (which ``Seq2SeqTrainingArguments.generation_config`` replaces at construction).
Generated ids are padded with the tokenizer's pad token (its EOS when it has none, else the model config's
``pad_token_id``) to the generation config's ``max_length`` (or ``max_new_tokens + 1``), and labels likewise;
the evaluation loop then pads them across batches and processes with -100 and gathers exactly one row per
sample, in dataset order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..evaluation import PredictionOutput
from ..trainer import Trainer
from .arguments import Seq2SeqTrainingArguments

logger = logging.getLogger(__name__)


class Seq2SeqTrainer(Trainer):
    """transformers' ``Seq2SeqTrainer`` over trainkit's engine (same arguments; see docs/trainer.md)."""

    def __init__(self, model: nn.Module | None = None, args: Seq2SeqTrainingArguments | None = None,
                 data_collator: Callable | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, model_init: Callable[..., nn.Module] | None = None,
                 compute_loss_func: Callable | None = None, compute_metrics: Callable | None = None,
                 callbacks: list | None = None, optimizers: tuple = (None, None),
                 preprocess_logits_for_metrics: Callable | None = None) -> None:
        if args is None:
            args = Seq2SeqTrainingArguments()
        elif not isinstance(args, Seq2SeqTrainingArguments):
            raise TypeError(f"Seq2SeqTrainer needs Seq2SeqTrainingArguments (got {type(args).__name__}): its generation "
                            "fields (predict_with_generate, generation_max_length, ...) decide evaluate/predict.")
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, model_init=model_init,
                         compute_loss_func=compute_loss_func, compute_metrics=compute_metrics, callbacks=callbacks,
                         optimizers=optimizers, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
        self.args: Seq2SeqTrainingArguments
        self._gen_kwargs: dict[str, Any] = {}
        if self.args.generation_config is not None:  # the arguments' config replaces the model's
            self.model.generation_config = self.load_generation_config(self.args.generation_config)

    @staticmethod
    def load_generation_config(gen_config_arg: Any) -> Any:
        """A GenerationConfig from ``Seq2SeqTrainingArguments.generation_config`` (a GenerationConfig, a folder, a
        ``generation_config.json`` file or a Hub id), strictly validated: transformers' own loader."""
        from transformers import Seq2SeqTrainer as TransformersSeq2SeqTrainer

        return TransformersSeq2SeqTrainer.load_generation_config(gen_config_arg)

    def _generation_kwargs(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        """``generate`` keywords of an ``evaluate``/``predict`` call: the call's own, then the arguments'
        ``generation_max_length`` (unless the call gives max_length or max_new_tokens) and ``generation_num_beams``."""
        resolved = dict(gen_kwargs)
        args = self.args
        if resolved.get("max_length") is None and resolved.get("max_new_tokens") is None and args.generation_max_length is not None:
            resolved["max_length"] = args.generation_max_length
        if resolved.get("num_beams") is None and args.generation_num_beams is not None:
            resolved["num_beams"] = args.generation_num_beams
        return resolved

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", **gen_kwargs: Any) -> dict[str, float]:
        """As ``Trainer.evaluate``; with ``predict_with_generate`` the metrics see generated ids, and ``gen_kwargs``
        (``max_length``, ``num_beams``, any ``generate`` keyword) override the arguments' and the model's."""
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                **gen_kwargs: Any) -> PredictionOutput:
        """As ``Trainer.predict``; with ``predict_with_generate`` the predictions are generated ids padded as the
        module docstring says, and ``gen_kwargs`` override the arguments' and the model's settings."""
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None,
                        **gen_kwargs: Any) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, generated ids, labels) of one batch with ``predict_with_generate``; otherwise the Trainer's step.

        ``gen_kwargs`` replace those of the current ``evaluate``/``predict`` call when given."""
        if not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only=prediction_loss_only,
                                           ignore_keys=ignore_keys)
        has_labels = "labels" in inputs
        prepare = getattr(self, "_prepare_inputs", None)
        if prepare is not None:
            inputs = prepare(inputs)
        call_kwargs = dict(gen_kwargs) if gen_kwargs else dict(self._gen_kwargs)
        for name in ("num_beams", "max_length"):
            if name in call_kwargs and call_kwargs[name] is None:
                del call_kwargs[name]
        # Sharded parameters: every rank runs as many forward passes as the longest generation needs.
        call_kwargs.setdefault("synced_gpus", self.accelerator.strategy.capabilities.shards_parameters)
        generator: Any = self.model  # a transformers model (GenerationMixin)
        with torch.no_grad():
            generated = generator.generate(**_generation_inputs(inputs), **call_kwargs)
        target_length = self._padded_generation_length()
        if generated.shape[-1] < target_length:
            generated = self._pad_tensors_to_max_len(generated, target_length)
        loss = self._generation_step_loss(model, inputs) if has_labels else None
        if self.args.prediction_loss_only:
            return loss, None, None
        labels = inputs["labels"] if has_labels else None
        if labels is not None and labels.shape[-1] < target_length:
            labels = self._pad_tensors_to_max_len(labels, target_length)
        return loss, generated, labels

    def _padded_generation_length(self) -> int:
        """The length generated ids and labels are padded to: the model's generation config's ``max_length``
        (with transformers' defaults filled in), or ``max_new_tokens + 1`` when that is longer."""
        config: Any = self.model.generation_config
        if config._from_model_config:  # generate() would otherwise rebuild it from the model config every batch
            config._from_model_config = False
        config.update(**config._get_default_generation_params(), defaults_only=True)
        length = config.max_length
        if config.max_new_tokens is not None:
            length = max(length, config.max_new_tokens + 1)
        return length

    def _generation_step_loss(self, model: nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The batch's loss from the model's forward pass on the inputs and labels (label-smoothed when asked)."""
        with torch.no_grad():
            outputs = model(**inputs)
            if self.args.label_smoothing_factor != 0:
                from transformers.trainer_pt_utils import LabelSmoother

                return LabelSmoother(epsilon=self.args.label_smoothing_factor)(outputs, inputs["labels"]).detach().mean()
            return (outputs["loss"] if isinstance(outputs, Mapping) else outputs[0]).detach().mean()

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """``tensor`` (batch, length) right-padded to ``max_length`` with the pad token: the processing class's
        (its EOS token when it has no pad token), else the model config's ``pad_token_id``."""
        tokenizer = self.processing_class
        if tokenizer is not None and hasattr(tokenizer, "pad_token_id"):
            pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        else:
            pad_token_id = getattr(getattr(self.model, "config", None), "pad_token_id", None)
            if pad_token_id is None:
                raise ValueError("Padding generated sequences needs a pad token: give the Seq2SeqTrainer a tokenizer "
                                 "(processing_class) or set model.config.pad_token_id.")
        padded = tensor.new_full((tensor.shape[0], max_length), pad_token_id)
        padded[:, : tensor.shape[-1]] = tensor
        return padded


def _generation_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What ``generate`` receives: the batch, without ``decoder_input_ids``/``decoder_attention_mask`` when they
    were made from the labels (same shape), so generation starts from the decoder start token."""
    labels, decoder_ids = inputs.get("labels"), inputs.get("decoder_input_ids")
    if labels is not None and decoder_ids is not None and labels.shape == decoder_ids.shape:
        return {k: v for k, v in inputs.items() if k not in ("decoder_input_ids", "decoder_attention_mask")}
    return dict(inputs)


__all__ = ["Seq2SeqTrainer"]
