"""TrainingArguments' grouped setters (``args.set_training(...)``, ``set_evaluate``, ...), with transformers' names.

Each setter changes a group of fields and returns the arguments, so calls chain as in transformers
(``TrainingArguments("out").set_training(learning_rate=1e-4).set_logging(steps=10)``). The new values are
validated exactly as at construction: the arguments are rebuilt from their fields with the changes, so a bad
value fails naming the field, and derived values (normalised strategies, FSDP options) follow.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any


class ArgumentSetters:
    """transformers' ``TrainingArguments.set_*`` methods (mixed into :class:`~trainkit.TrainingArguments`)."""

    def _set(self, **changes: Any) -> Any:
        """Apply ``changes`` through a full validation (a fresh instance built from every field), then adopt it."""
        current = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]  # self is the dataclass this mixes into
        validated = type(self)(**{**current, **changes})
        self.__dict__.update(validated.__dict__)
        return self

    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1, seed: int = 42,
                     activation_checkpointing: bool = False, gradient_checkpointing: bool | None = None) -> Any:
        """Training hyperparameters (and ``do_train=True``); ``gradient_checkpointing`` is the older name of
        ``activation_checkpointing``."""
        if gradient_checkpointing is not None:
            warnings.warn("set_training(gradient_checkpointing=...) is the older name of activation_checkpointing.",
                          FutureWarning, stacklevel=2)
            activation_checkpointing = gradient_checkpointing
        return self._set(do_train=True, learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                         weight_decay=weight_decay, num_train_epochs=num_epochs, max_steps=max_steps,
                         gradient_accumulation_steps=gradient_accumulation_steps, seed=seed,
                         activation_checkpointing=activation_checkpointing,
                         gradient_checkpointing=activation_checkpointing)

    def set_evaluate(self, strategy: Any = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None, loss_only: bool = False) -> Any:
        """Evaluation during training (``do_eval`` follows the strategy)."""
        if _value(strategy) == "steps" and steps == 0:
            raise ValueError("set_evaluate(strategy='steps') needs steps > 0.")
        return self._set(eval_strategy=strategy, do_eval=_value(strategy) != "no", eval_steps=steps,
                         per_device_eval_batch_size=batch_size, eval_accumulation_steps=accumulation_steps,
                         eval_delay=delay or 0, prediction_loss_only=loss_only)

    def set_testing(self, batch_size: int = 8, loss_only: bool = False) -> Any:
        """Prediction settings (and ``do_predict=True``)."""
        return self._set(do_predict=True, per_device_eval_batch_size=batch_size, prediction_loss_only=loss_only)

    def set_save(self, strategy: Any = "steps", steps: int = 500, total_limit: int | None = None,
                 on_each_node: bool = False) -> Any:
        """Checkpoint saving."""
        if _value(strategy) == "steps" and steps == 0:
            raise ValueError("set_save(strategy='steps') needs steps > 0.")
        return self._set(save_strategy=strategy, save_steps=steps, save_total_limit=total_limit,
                         save_on_each_node=on_each_node)

    def set_logging(self, strategy: Any = "steps", steps: int = 500, report_to: str | list[str] = "none",
                    level: str = "passive", first_step: bool = False, nan_inf_filter: bool = False,
                    on_each_node: bool = False, replica_level: str = "passive") -> Any:
        """Logging: when, where to report, and the log levels."""
        if _value(strategy) == "steps" and steps == 0:
            raise ValueError("set_logging(strategy='steps') needs steps > 0.")
        return self._set(logging_strategy=strategy, logging_steps=steps, report_to=report_to, log_level=level,
                         logging_first_step=first_step, logging_nan_inf_filter=nan_inf_filter,
                         log_on_each_node=on_each_node, log_level_replica=replica_level)

    def set_push_to_hub(self, model_id: str, strategy: Any = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False, revision: str | None = None) -> Any:
        """Uploads to the Hub (``push_to_hub=True``; the repository is checked when the Trainer is built)."""
        return self._set(push_to_hub=True, hub_model_id=model_id, hub_strategy=strategy, hub_token=token,
                         hub_private_repo=private_repo, hub_always_push=always_push, hub_revision=revision)

    def set_optimizer(self, name: Any = "adamw_torch", learning_rate: float = 5e-5, weight_decay: float = 0,
                      beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, args: str | None = None) -> Any:
        """The optimizer and its hyperparameters."""
        return self._set(optim=name, learning_rate=learning_rate, weight_decay=weight_decay, adam_beta1=beta1,
                         adam_beta2=beta2, adam_epsilon=epsilon, optim_args=args)

    def set_lr_scheduler(self, name: Any = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0) -> Any:
        """The learning-rate schedule and the run's length."""
        return self._set(lr_scheduler_type=name, num_train_epochs=num_epochs, max_steps=max_steps,
                         warmup_steps=warmup_steps)

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, multiprocessing_context: str | None = None,
                       in_order: bool = True, auto_find_batch_size: bool = False, ignore_data_skip: bool = False,
                       sampler_seed: int | None = None) -> Any:
        """Batch sizes and DataLoader settings."""
        return self._set(per_device_train_batch_size=train_batch_size, per_device_eval_batch_size=eval_batch_size,
                         dataloader_drop_last=drop_last, dataloader_num_workers=num_workers,
                         dataloader_pin_memory=pin_memory, dataloader_persistent_workers=persistent_workers,
                         dataloader_prefetch_factor=prefetch_factor,
                         dataloader_multiprocessing_context=multiprocessing_context, dataloader_in_order=in_order,
                         auto_find_batch_size=auto_find_batch_size, ignore_data_skip=ignore_data_skip,
                         data_seed=sampler_seed)


def _value(choice: Any) -> Any:
    """A transformers enum member's value, or the string itself."""
    return getattr(choice, "value", choice)
