"""What the Trainer reports: logs, floating-point operations, input tokens, learning rates, metrics files.

transformers' hooks of that concept (``log``, ``store_flos``, ``floating_point_ops``, ``_track_num_input_tokens``,
``metrics_format``, ...) as one mixin of :class:`~trainkit.Trainer`. Per micro-batch only host numbers and
device tensors are added (no synchronisation); :meth:`ReportingMethods.store_flos` sums the processes' counts
when they are stored (at a log, a checkpoint and the end of training).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .data import samples_in, tokens_in
from .evaluation import speed_metrics
from .meter import current_learning_rate, log_metrics_block, write_metrics_file

if TYPE_CHECKING:
    from torch import nn

    from trainkit.engine import Accelerator

    from .training_arguments.arguments import TrainingArguments
    from .callbacks import CallbackHandler, TrainerControl, TrainerState
    from .meter import TrainingMeter

# a Trainer mixin's messages are the Trainer's: one logger for them all, as transformers' come from transformers.trainer
logger = logging.getLogger("trainkit.trainer.trainer")


class ReportingMethods:
    """transformers' logging and accounting hooks (mixed into :class:`~trainkit.Trainer`)."""

    if TYPE_CHECKING:
        args: TrainingArguments
        accelerator: Accelerator
        model: nn.Module
        optimizer: Any
        lr_scheduler: Any
        state: TrainerState
        control: TrainerControl
        callback_handler: CallbackHandler
        meter: TrainingMeter
        main_input_name: str
        current_flos: float
        _num_parameters: int
        _initial_num_input_tokens_seen: int

        def is_world_process_zero(self) -> bool: ...

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record ``logs`` (with epoch and step) in ``state.log_history`` and send them to the callbacks and trackers.

        ``epoch`` (and the token count) are added to ``logs`` itself, as transformers does: the metrics that
        ``train()`` and ``evaluate()`` return, and scripts save with ``save_metrics``, carry the epoch. With
        ``include_num_input_tokens_seen``, ``start_time`` (a ``time.time()``) adds this run's token throughput."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                tokens = self.state.num_input_tokens_seen - getattr(self, "_initial_num_input_tokens_seen", 0)
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    def floating_point_ops(self, inputs: Any) -> int:
        """Floating-point operations of one forward and backward on ``inputs``: 6 x parameters x input tokens
        (without the embedding tables when the model can say so, as transformers' ``num_parameters`` does);
        0 when the batch has no ``main_input_name``. Override it for another estimate."""
        main = inputs.get(self.main_input_name) if isinstance(inputs, Mapping) else None
        if not isinstance(main, torch.Tensor):
            return 0
        return 6 * main.numel() * self._num_parameters

    def store_flos(self) -> None:
        """Add the operations counted since the last call, summed over processes, to ``state.total_flos``
        (collective: called by every process at each log, checkpoint and the end of training)."""
        flos = float(self.current_flos)
        if self.accelerator.num_processes > 1:
            total = torch.tensor(flos, dtype=torch.float64, device=self.accelerator.device)
            flos = float(self.accelerator.reduce(total, reduction="sum"))
        self.state.total_flos += flos
        self.current_flos = 0

    def _track_num_input_tokens(self, inputs: Any) -> None:
        """Count one micro-batch's samples and input tokens (all, or non-padding ones) for the throughput and
        ``num_input_tokens_seen``: on the device, summed over processes at the next log."""
        non_padding = self.args.include_num_input_tokens_seen == "non_padding"
        self.meter.add_micro_batch(samples_in(inputs), tokens_in(inputs, self.main_input_name, non_padding))

    def _get_learning_rate(self) -> float:
        """The first parameter group's learning rate now (from the schedule when it has one)."""
        return current_learning_rate(self.lr_scheduler, self.optimizer)

    def get_learning_rates(self) -> list[float]:
        """Every parameter group's learning rate."""
        if self.optimizer is None:
            raise ValueError("get_learning_rates() needs the optimizer: call create_optimizer() or train() first.")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_num_trainable_parameters(self) -> int:
        """Parameters that require gradients."""
        return sum(parameter.numel() for parameter in self.model.parameters() if parameter.requires_grad)

    def metrics_format(self, metrics: dict[str, float]) -> dict[str, Any]:
        """``metrics`` made readable, as transformers shows them: memory in MB, run times as h:mm:ss,
        ``total_flos`` in GF, floats rounded to 4 digits."""
        from transformers.trainer_pt_utils import metrics_format

        return metrics_format(metrics)

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Log ``metrics`` of ``split`` as a readable block (main process; see :meth:`metrics_format`)."""
        if self.is_world_process_zero():
            log_metrics_block(split, self.metrics_format(metrics))

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write ``{split}_results.json`` (and merge into ``all_results.json`` if ``combined``) in output_dir."""
        if self.is_world_process_zero():
            write_metrics_file(str(self.args.output_dir), split, metrics, combined=combined)


def apply_log_level(args: TrainingArguments) -> None:
    """log_level (log_level_replica on the processes that do not log, per log_on_each_node) sets trainkit's
    loggers and, as in transformers, transformers' verbosity; "passive" leaves both as they are."""
    level = args.log_level if args.should_log else args.log_level_replica
    if level != "passive":
        logging.getLogger("trainkit").setLevel(getattr(logging, level.upper()))
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity(getattr(logging, level.upper()))
