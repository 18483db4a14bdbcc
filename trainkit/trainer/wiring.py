"""Where TrainingArguments fields act in the Trainer: engine options, the training sampler, model hooks, the loss.

One small function per concern, so the Trainer's own methods stay short: ``engine_options`` (DDP keyword
arguments, process-group backend and timeout, DataLoader configuration), ``prepare_model_features`` (activation checkpointing, ``use_cache``,
NEFTune, Liger, ``debug``), ``label_smoothed_loss``, ``seed_run`` (``full_determinism``),
``maybe_empty_cache`` and ``train_with_batch_size_search`` (``auto_find_batch_size``), ``replan_schedule``.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainkit.config.errors import check_choice

logger = logging.getLogger(__name__)


def engine_options(args: Any) -> dict[str, Any]:
    """Accelerator keyword arguments the ddp_* fields and accelerator_config decide."""
    from trainkit.engine import (
        DataLoaderConfiguration,
        DistributedDataParallelKwargs,
        GradientAccumulationPlugin,
        InitProcessGroupKwargs,
    )

    ddp_fields = {"find_unused_parameters": args.ddp_find_unused_parameters, "bucket_cap_mb": args.ddp_bucket_cap_mb,
                  "broadcast_buffers": args.ddp_broadcast_buffers, "static_graph": args.ddp_static_graph}
    handlers: list[Any] = [InitProcessGroupKwargs(backend=args.ddp_backend, timeout=args.ddp_timeout_if_set)]
    chosen = {key: value for key, value in ddp_fields.items() if value is not None}
    if chosen:
        handlers.append(DistributedDataParallelKwargs(**chosen))
    # The Trainer resumes at the exact next batch: its loader's position is restored, never replayed.
    # transformers' Trainer shuffles with the seedable sampler (its accelerator_config default), from data_seed.
    # data_seed None: the engine takes torch's initial seed, what the Trainer's set_seed(seed) left (Accelerate's rule).
    data_config = DataLoaderConfiguration(data_seed=args.data_seed, use_stateful_dataloader=True,
                                          use_seedable_sampler=True)
    options: dict[str, Any] = {"kwargs_handlers": handlers, "dataloader_config": data_config}
    config = _accelerator_config_dict(args.accelerator_config)
    for key, value in config.items():
        if key == "use_configured_state":
            continue  # trainkit always reuses the process's existing state: what True asks for
        if key == "gradient_accumulation_kwargs":  # read by TrainingArguments; only sync_each_batch reaches the engine
            if (value or {}).get("sync_each_batch"):
                options["gradient_accumulation_plugin"] = GradientAccumulationPlugin(num_steps=1, sync_each_batch=True)
            continue
        if not hasattr(data_config, key):
            raise ValueError(f"accelerator_config[{key!r}] is not supported by this trainkit engine's DataLoaderConfiguration.")
        setattr(data_config, key, value)
    return options


def _accelerator_config_dict(config: Any) -> dict[str, Any]:
    """``args.accelerator_config`` (transformers' AcceleratorConfig, which a script may have changed since the
    arguments were built) as a dict, checked again: an attribute set afterwards names a key too."""
    from .training_arguments.checks import DATALOADER_KEYS, OTHER_ACCELERATOR_KEYS

    values = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    for key in values:
        check_choice("accelerator_config key", key, DATALOADER_KEYS + OTHER_ACCELERATOR_KEYS, where="TrainingArguments")
    return values


def prepare_model_features(trainer: Any, model: nn.Module) -> None:
    """Apply the model-side fields before the engine wraps the model."""
    args = trainer.args
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = args.use_cache
    if args.activation_checkpointing:
        _enable_activation_checkpointing(model, dict(args.activation_checkpointing_kwargs or {}))
    if args.use_liger_kernel:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model, **(args.liger_kernel_config or {}))
    if "underflow_overflow" in args.debug:
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(model)


def _enable_activation_checkpointing(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Call the checkpointing method the model has: transformers >= 5.23's ``activation_checkpointing_enable``, else
    ``gradient_checkpointing_enable`` (older releases and custom models), passing ``every_n_layers`` / ``offload``
    only to a method that takes them."""
    from .training_arguments.fields import CHECKPOINTING_LAYER_OPTIONS, requested_layer_options

    layer_options = requested_layer_options(kwargs)
    checkpoint_kwargs = {key: value for key, value in kwargs.items() if key not in CHECKPOINTING_LAYER_OPTIONS}
    method: Callable[..., Any]
    if hasattr(model, "activation_checkpointing_enable"):
        method, kwargs_name = getattr(model, "activation_checkpointing_enable"), "activation_checkpointing_kwargs"
    elif hasattr(model, "gradient_checkpointing_enable"):
        method, kwargs_name = getattr(model, "gradient_checkpointing_enable"), "gradient_checkpointing_kwargs"
    else:
        raise ValueError(f"activation_checkpointing=True, but {type(model).__name__} has no "
                         "activation_checkpointing_enable() or gradient_checkpointing_enable().")
    parameters = inspect.signature(method).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    lacking = [] if takes_any else sorted(set(layer_options) - set(parameters))
    if lacking:
        raise ValueError(f"activation_checkpointing_kwargs {lacking} need a model whose {method.__name__}() takes "
                         f"them; {type(model).__name__}'s does not (transformers models take them since 5.16).")
    call = dict(layer_options)
    if takes_any or kwargs_name in parameters:
        call[kwargs_name] = checkpoint_kwargs or None
    elif checkpoint_kwargs:
        raise ValueError(f"activation_checkpointing_kwargs {sorted(checkpoint_kwargs)}: {type(model).__name__}."
                         f"{method.__name__}() takes no {kwargs_name}.")
    method(**call)


def label_smoother(args: Any, model: nn.Module) -> Any:
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


def seed_run(args: Any) -> None:
    """set_seed, or with full_determinism transformers' enable_full_determinism (deterministic kernels too)."""
    if args.full_determinism:
        from transformers.trainer_utils import enable_full_determinism

        enable_full_determinism(args.seed)
    else:
        from trainkit.engine import set_seed

        set_seed(args.seed)


def maybe_empty_cache(args: Any, global_step: int, device: torch.device) -> None:
    """Every ``torch_empty_cache_steps`` optimizer steps, release the accelerator's cached memory."""
    steps = args.torch_empty_cache_steps
    if not steps or global_step % steps or device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "empty_cache"):
        accelerator.empty_cache()
    elif device.type == "cuda":
        torch.cuda.empty_cache()


def apply_log_level(args: Any) -> None:
    """log_level (log_level_replica on the processes that do not log, per log_on_each_node) sets trainkit's
    loggers and, as in transformers, transformers' verbosity; "passive" leaves both as they are."""
    level = args.log_level if args.should_log else args.log_level_replica
    if level != "passive":
        logging.getLogger("trainkit").setLevel(getattr(logging, level.upper()))
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity(getattr(logging, level.upper()))


def batch_size_to_resume(trainer: Any, folder: str | None) -> None:
    """With auto_find_batch_size, a resume starts from the batch size the interrupted run had found."""
    if folder and trainer.args.auto_find_batch_size:
        from .checkpointing.resume import saved_train_batch_size

        trainer._train_batch_size = saved_train_batch_size(trainer, folder) or trainer._train_batch_size


def train_with_batch_size_search(trainer: Any, run: Callable[..., Any], batch_size: int) -> Any:
    """``run(batch_size=...)``; on an out-of-memory error take 90% of the batch size (rounded down) and start
    again, as transformers' auto_find_batch_size does (accelerate's find_executable_batch_size; every process
    must hit the error together, as on equal GPUs). The arguments keep the batch size the script gave; the
    Trainer trains with ``trainer._train_batch_size`` (also ``state.train_batch_size``, so a resume starts from it)."""
    from trainkit.engine import is_out_of_memory, release_memory

    while True:
        try:
            return run(batch_size=batch_size)
        except Exception as error:  # noqa: BLE001 - only out-of-memory errors are retried
            smaller = int(batch_size * 0.9)
            if not is_out_of_memory(error) or smaller < 1:
                raise
            if trainer.optimizer is not None:
                trainer.optimizer.zero_grad(set_to_none=True)
            release_memory()
            batch_size = smaller
            logger.warning("Out of memory: training again with a training batch size of %d per process.", batch_size)


def replan_schedule(trainer: Any, max_steps: int) -> None:
    """Re-span a schedule the Trainer built when a new run plans a different number of steps (the object stays
    the one registered for checkpointing; its state is replaced by a fresh schedule's)."""
    if not getattr(trainer, "_scheduler_built", False) or getattr(trainer, "_scheduled_steps", None) == max_steps:
        return
    from .optim import build_scheduler

    optimizer = trainer.lr_scheduler.optimizer
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    fresh = build_scheduler(optimizer, trainer.args, max_steps)
    trainer.lr_scheduler.__dict__.update(fresh.__dict__)
    trainer._scheduled_steps = max_steps


def memory_tracker(args: Any) -> Any:
    """transformers' TrainerMemoryTracker: with skip_memory_metrics=False it adds ``*_mem_*_delta`` metrics
    to train/evaluate results (CPU through psutil, plus the GPU where there is one)."""
    from transformers.trainer_utils import TrainerMemoryTracker

    tracker = TrainerMemoryTracker(args.skip_memory_metrics)
    # It names the stage after its caller; releases before the loop was split (5.1) do not know _finalize_training.
    tracker.stages = {**tracker.stages, "_finalize_training": "train"}
    return tracker
