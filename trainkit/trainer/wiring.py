"""Where TrainingArguments fields act in the Trainer: engine options, the training sampler, model hooks, the loss.

One small function per concern, so the Trainer's own methods stay short: ``engine_options`` (DDP keyword
arguments, process-group backend and timeout, DataLoader configuration), ``train_sampler``
(``train_sampling_strategy``), ``prepare_model_features`` (activation checkpointing, ``use_cache``,
NEFTune, Liger, ``debug``), ``label_smoothed_loss``, ``seed_run`` (``full_determinism``),
``maybe_empty_cache`` and ``train_with_batch_size_search`` (``auto_find_batch_size``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def engine_options(args: Any) -> dict[str, Any]:
    """Accelerator keyword arguments the ddp_* fields and accelerator_config decide."""
    from trainkit.utils.dataclasses import DataLoaderConfiguration, DistributedDataParallelKwargs, InitProcessGroupKwargs

    if args.save_on_each_node:
        state = args._process_state()
        if state.local_world_size != state.world_size:
            raise ValueError("save_on_each_node=True on several machines: trainkit's Trainer writes each checkpoint once, "
                             "from the main process, so output_dir must be a filesystem all machines share.")
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
    for key, value in args.accelerator_config.items():
        if key in ("use_configured_state", "gradient_accumulation_kwargs"):
            continue  # trainkit always reuses the process's existing state; the Trainer accumulates itself
        if not hasattr(data_config, key):
            raise ValueError(f"accelerator_config[{key!r}] is not supported by this trainkit engine's DataLoaderConfiguration.")
        setattr(data_config, key, value)
    return {"kwargs_handlers": handlers, "dataloader_config": data_config}


class LengthGroupedPassSampler(torch.utils.data.Sampler):
    """transformers' length-grouped order (megabatches sorted by length, the longest batch first), drawn at each pass's
    start from torch's global generator as transformers' ``LengthGroupedSampler`` draws it, so the order and the random
    stream are transformers'. A prepared loader calls :meth:`draw_pass_order` when the pass starts (and replays it on
    resume: trainkit/engine/data/pass_draws.py); every process takes the main process's order. With ``seed`` (an
    evaluation order) every pass draws from a generator seeded with it instead: the same order each time."""

    def __init__(self, batch_size: int, dataset: Any, lengths: list[int] | None, model_input_name: str | None,
                 seed: int | None = None) -> None:
        from transformers.trainer_pt_utils import LengthGroupedSampler

        grouped = LengthGroupedSampler(batch_size, dataset=dataset, lengths=lengths, model_input_name=model_input_name)
        self.lengths, self.batch_size, self.seed = grouped.lengths, grouped.batch_size, seed
        self._order: list[int] | None = None

    def draw_pass_order(self, generator: torch.Generator) -> None:
        """Draw the next pass's order from ``generator`` (every process draws; the main process's order is kept)."""
        from transformers.trainer_pt_utils import get_length_grouped_indices

        from trainkit.utils import broadcast_object_list

        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed)
        order = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            order = broadcast_object_list([order])[0]
        self._order = order

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        if self._order is None:  # iterated outside a prepared loader: draw now, as transformers' sampler does
            self.draw_pass_order(torch.default_generator)
        order, self._order = self._order, None
        return iter(order)


def _lengths_and_input_name(trainer: Any, dataset: Any) -> tuple[Any, str | None]:
    """The dataset's length column (``length_column_name``) and the processing class's first input name, as
    transformers reads them for length grouping."""
    args = trainer.args
    columns = getattr(dataset, "column_names", None) or []
    lengths = dataset[args.length_column_name] if args.length_column_name in columns else None
    input_names = getattr(trainer.processing_class, "model_input_names", None)
    return lengths, input_names[0] if input_names else None


def train_sampler(trainer: Any, dataset: Any) -> torch.utils.data.Sampler | None:
    """The sampler ``train_sampling_strategy`` names (None for a dataset without a length: its own order)."""
    args = trainer.args
    if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        if args.train_sampling_strategy != "random":
            raise ValueError(f"train_sampling_strategy={args.train_sampling_strategy!r} needs a dataset with len(); "
                             "an iterable dataset is read in its own order.")
        return None
    if args.train_sampling_strategy == "sequential":
        return torch.utils.data.SequentialSampler(dataset)
    if args.train_sampling_strategy != "group_by_length":
        return torch.utils.data.RandomSampler(dataset)
    lengths, model_input_name = _lengths_and_input_name(trainer, dataset)
    # Megabatches of a whole optimizer step's batches, as transformers groups them.
    megabatch = args.per_device_train_batch_size * trainer.accelerator.config.gradient_accumulation_steps
    return LengthGroupedPassSampler(megabatch, dataset, lengths, model_input_name)


EVAL_ORDER_SEEDED_SINCE = (5, 16)
"""From this transformers release a length-grouped evaluation order comes from ``data_seed`` (before: the global RNG)."""


def eval_sampler(trainer: Any, dataset: Any) -> torch.utils.data.Sampler | None:
    """The evaluation order: transformers' length-grouped one under ``group_by_length`` (from a generator seeded
    with ``data_seed``, else ``seed``; before transformers 5.16 drawn from the global RNG at each evaluation), else
    sequential; None for a dataset without a length."""
    from .argument_fields import installed_transformers_release

    args = trainer.args
    if dataset is None or not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if args.train_sampling_strategy == "group_by_length":
        lengths, model_input_name = _lengths_and_input_name(trainer, dataset)
        seed = args.data_seed if args.data_seed is not None else args.seed
        if installed_transformers_release() < EVAL_ORDER_SEEDED_SINCE:
            seed = None
        return LengthGroupedPassSampler(args.per_device_eval_batch_size, dataset, lengths, model_input_name, seed)
    return torch.utils.data.SequentialSampler(dataset)


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
    if args.neftune_noise_alpha is not None:
        from .neftune import activate_neftune  # the installed transformers' hook, wherever that release has it

        trainer.neftune_hook_handle = activate_neftune(model, args.neftune_noise_alpha)
    if "underflow_overflow" in args.debug:
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(model)


def _enable_activation_checkpointing(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Call the checkpointing method the model has: transformers >= 5.23's ``activation_checkpointing_enable``, else
    ``gradient_checkpointing_enable`` (older releases and custom models), passing ``every_n_layers`` / ``offload``
    only to a method that takes them."""
    from .argument_fields import CHECKPOINTING_LAYER_OPTIONS, requested_layer_options

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


def label_smoothed_loss(trainer: Any, model: nn.Module, inputs: Mapping[str, Any], num_items_in_batch: Any = None,
                        model_kwargs: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, Any]:
    """(loss, outputs) with transformers' LabelSmoother: labels are withheld from the model, and shifted by one
    for causal language models, as transformers does; the smoother divides by ``num_items_in_batch`` where the
    installed release's takes it (5.17 and later)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.trainer_pt_utils import LabelSmoother

    from .data import call_model

    label_name = trainer.label_names[0]
    labels = inputs[label_name]
    outputs = call_model(model, {k: v for k, v in inputs.items() if k != label_name}, **(model_kwargs or {}))
    unwrapped = trainer.accelerator.unwrap_model(model)
    causal = unwrapped._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if hasattr(unwrapped, "_get_name") else False
    smoother = LabelSmoother(epsilon=trainer.args.label_smoothing_factor)
    if num_items_in_batch is not None and "num_items_in_batch" in inspect.signature(smoother.__call__).parameters:
        return smoother(outputs, labels, shift_labels=causal, num_items_in_batch=num_items_in_batch), outputs
    return smoother(outputs, labels, shift_labels=causal), outputs


def seed_run(args: Any) -> None:
    """set_seed, or with full_determinism transformers' enable_full_determinism (deterministic kernels too)."""
    if args.full_determinism:
        from transformers.trainer_utils import enable_full_determinism

        enable_full_determinism(args.seed)
    else:
        from trainkit.utils.random import set_seed

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


def train_with_batch_size_search(trainer: Any, run: Callable[[], Any]) -> Any:
    """Run training; on an out-of-memory error halve ``per_device_train_batch_size`` and start again (as
    transformers' auto_find_batch_size; every process must hit the error together, as on equal GPUs)."""
    from trainkit.utils.memory import is_out_of_memory, release_memory

    args = trainer.args
    while True:
        try:
            return run()
        except Exception as error:  # noqa: BLE001 - only out-of-memory errors are retried
            if not is_out_of_memory(error) or args.per_device_train_batch_size <= 1:
                raise
            if trainer.optimizer is not None:
                trainer.optimizer.zero_grad(set_to_none=True)
            release_memory()
            args.per_device_train_batch_size //= 2
            logger.warning("Out of memory: training again with per_device_train_batch_size=%d.",
                           args.per_device_train_batch_size)


def replan_schedule(trainer: Any, max_steps: int) -> None:
    """Re-span a schedule the Trainer built when a new run plans a different number of steps (the object stays
    the one registered for checkpointing; its state is replaced by a fresh schedule's)."""
    if not getattr(trainer, "_scheduler_built", False) or trainer.state.max_steps == max_steps:
        return
    from .optim import build_scheduler

    optimizer = trainer.lr_scheduler.optimizer
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    fresh = build_scheduler(optimizer, trainer.args, max_steps)
    trainer.lr_scheduler.__dict__.update(fresh.__dict__)


def cast_for_full_eval(trainer: Any) -> None:
    """bf16_full_eval / fp16_full_eval: outside training, evaluate with the model itself in that dtype (as
    transformers; during training, evaluations keep the training precision)."""
    args = trainer.args
    if trainer.is_in_train or not (args.bf16_full_eval or args.fp16_full_eval):
        return
    dtype = torch.bfloat16 if args.bf16_full_eval else torch.float16
    trainer.model_wrapped.to(dtype=dtype)


def memory_tracker(args: Any) -> Any:
    """transformers' TrainerMemoryTracker: with skip_memory_metrics=False it adds ``*_mem_*_delta`` metrics
    to train/evaluate results (CPU through psutil, plus the GPU where there is one)."""
    from transformers.trainer_utils import TrainerMemoryTracker

    return TrainerMemoryTracker(args.skip_memory_metrics)
