"""Training-time counters (loss, samples, tokens, time) kept on the device between logs and read once per log.

Per optimizer step the loop only adds tensors, so no step waits for the device or the other processes;
at a logging step one all-reduce turns the counters into global means and rates, which the helpers at
the end of this module turn into log lines and metrics files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Dense bf16/fp16 tensor-core peaks (FLOP/s) of common accelerators, for model FLOPs utilisation.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "V100": 125e12,
}


def device_peak_flops(device: torch.device) -> float | None:
    """The peak FLOP/s of ``device`` when known (CUDA GPUs in :data:`PEAK_FLOPS`), else None."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS.items():
        if key in name:
            return peak
    return None


class TrainingMeter:
    """Accumulates per-step values since the last log and turns them into log entries."""

    def __init__(self, accelerator, num_parameters: int) -> None:
        self.accelerator = accelerator
        self.num_parameters = num_parameters
        self.peak_flops = device_peak_flops(accelerator.device)
        self.total_loss = 0.0
        """Sum over all logged steps of the global mean loss (for the final ``train_loss``)."""
        self.total_steps = 0
        self._reset()

    def _reset(self) -> None:
        device = self.accelerator.device
        self.loss_sum = torch.zeros((), device=device)
        self.samples = 0
        self.tokens: torch.Tensor | int = 0
        self.steps = 0
        self.started = time.perf_counter()

    def add_micro_batch(self, samples: int, tokens: torch.Tensor | int) -> None:
        """Count one micro-batch: samples (host int) and input tokens (host int, or a tensor for non-padding)."""
        self.samples += samples
        self.tokens = self.tokens + tokens

    def add_step(self, window_loss: torch.Tensor, skip_non_finite: bool) -> None:
        """Add one optimizer step's loss (this process's share of the global window mean).

        ``skip_non_finite`` (``logging_nan_inf_filter``) counts a NaN/inf step as transformers does: as the sum
        of this log's earlier steps divided by their number plus one (0 for the first step of a log), so a
        logged loss stays finite even when every step of its interval diverged.
        """
        window_loss = window_loss.detach().float()
        if skip_non_finite:
            stand_in = self.loss_sum / (self.steps + 1)
            window_loss = torch.where(torch.isfinite(window_loss), window_loss, stand_in)
        self.loss_sum += window_loss
        self.steps += 1

    def flush(self) -> dict[str, float]:
        """Global values since the last flush (one all-reduce, one host sync), then start counting afresh."""
        if self.steps == 0:
            return {}
        device = self.accelerator.device
        tokens = self.tokens if isinstance(self.tokens, torch.Tensor) else torch.tensor(float(self.tokens))
        packed = torch.stack([
            self.loss_sum.float(),
            torch.tensor(float(self.samples), device=device),
            tokens.to(device).float(),
        ])
        if self.accelerator.num_processes > 1:
            packed = self.accelerator.reduce(packed, reduction="sum")
        loss_sum, samples, tokens = packed.tolist()
        # The ranks of a tensor-parallel group read the same batch: the sum counted it once per rank.
        copies = self.accelerator.num_processes // self.accelerator.strategy.data_parallel_size
        loss_sum, samples, tokens = loss_sum / copies, samples / copies, tokens / copies
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        steps = self.steps
        mean_loss = loss_sum / steps
        self.total_loss += loss_sum
        self.total_steps += steps
        values = {
            "loss": mean_loss,
            "samples": samples,
            "tokens": tokens,
            "samples_per_second": samples / elapsed,
            "step_time": elapsed / steps,
        }
        if tokens:
            values["tokens_per_second"] = tokens / elapsed
            if self.peak_flops:
                achieved = 6.0 * self.num_parameters * tokens / elapsed
                values["mfu"] = achieved / (self.peak_flops * self.accelerator.num_processes)
        self._reset()
        return values

    @property
    def train_loss(self) -> float:
        """Mean loss over every step flushed so far; 0.0 before any (a run resumed from its last checkpoint trains
        no step: transformers reports 0.0 then)."""
        return self.total_loss / self.total_steps if self.total_steps else 0.0


THROUGHPUT_KEYS = ("samples_per_second", "tokens_per_second", "step_time", "mfu")
"""What trainkit measures beyond transformers' per-step log: written to the trackers (metrics.jsonl, TensorBoard...)
with the step's log, never into ``state.log_history`` or the callbacks' ``logs``."""


def training_logs(values: dict[str, float], grad_norm: Any, learning_rate: float) -> dict[str, float]:
    """The periodic training log from the meter's ``flush()``, with transformers' keys: loss, grad_norm (when
    clipping measured one) and learning_rate (``Trainer.log`` adds the epoch)."""
    logs: dict[str, float] = {"loss": values["loss"]}
    if grad_norm is not None:
        logs["grad_norm"] = float(grad_norm)
    logs["learning_rate"] = learning_rate
    return logs


def throughput_logs(values: dict[str, float]) -> dict[str, float]:
    """The speeds of the meter's ``flush()`` (:data:`THROUGHPUT_KEYS` it measured), for the trackers only."""
    return {key: values[key] for key in THROUGHPUT_KEYS if key in values}


def flops_parameters(model: Any) -> int:
    """The parameter count in the 6 x parameters x tokens estimate of ``total_flos``: without the embedding
    tables when the model can say so (transformers' ``num_parameters(exclude_embeddings=True)``, the count its
    ``floating_point_ops`` uses), otherwise every parameter."""
    count = getattr(model, "num_parameters", None)
    if callable(count):
        try:
            return int(count(exclude_embeddings=True))
        except TypeError:  # a num_parameters of another signature: fall back to counting
            pass
    return sum(p.numel() for p in model.parameters())


def current_learning_rate(scheduler: Any, optimizer: Any) -> float:
    """The first parameter group's learning rate, from the schedule when it has one."""
    if hasattr(scheduler, "get_last_lr"):
        return float(scheduler.get_last_lr()[0])
    return float(optimizer.param_groups[0]["lr"])


def log_metrics_block(split: str, metrics: dict[str, float]) -> None:
    """Log ``metrics`` of ``split`` as a readable block."""
    lines = "\n".join(f"  {key:<32} = {value}" for key, value in sorted(metrics.items()))
    logger.info("***** %s metrics *****\n%s", split, lines)


def write_metrics_file(output_dir: str, split: str, metrics: dict[str, float], combined: bool = True) -> None:
    """Write ``{split}_results.json`` into ``output_dir``; ``combined`` also merges ``metrics`` into
    ``all_results.json`` (what pipelines around transformers' example scripts read). Same layout as
    transformers' files (4-space indent, sorted keys)."""
    os.makedirs(output_dir, exist_ok=True)
    _write_json(os.path.join(output_dir, f"{split}_results.json"), metrics)
    if combined:
        path = os.path.join(output_dir, "all_results.json")
        everything: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                everything = json.load(handle)
        everything.update(metrics)
        _write_json(path, everything)


def _write_json(path: str, values: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(values, handle, indent=4, sort_keys=True)
