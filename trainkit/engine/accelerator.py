"""The ``Accelerator`` facade: Accelerate's public API over trainkit's engine.

Its configuration is resolved once (:mod:`trainkit.config.engine`: explicit arguments, then the
launcher's config, then defaults) and each piece receives its part; then it delegates: process identity
to :mod:`state`, wrapping to a :mod:`strategies` object, mixed precision to :mod:`precision`, data to
:mod:`data`, communication to :mod:`collectives`, logging to :mod:`tracking` and checkpoints to
:mod:`checkpointing`. It holds no strategy branching of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainkit.config.deepspeed import DeepSpeedPlugin
from trainkit.config.dynamo import TorchDynamoPlugin
from trainkit.config.engine import EngineConfig
from trainkit.config.ignored_field import honour_ignored_keyword
from trainkit.engine.process import collectives
from trainkit.engine.step.accumulation import GradientState, sum_across_processes
from trainkit.engine.accelerator_parts.options import resolve_compat_options
from trainkit.engine.accelerator_parts.attributes import AccelerateAttributes, refuse_parallelism
from trainkit.engine.step.compile import compile_model
from trainkit.engine.step.unwrapping import extract_model
from trainkit.engine.accelerator_parts.configuration import announce, resolve_for_accelerator
from trainkit.engine.parallel.pretrained import check_run_matches, sharded_by_transformers
from trainkit.engine.parallel.selection import parallel_dims_for
from trainkit.engine.deepspeed.from_config import (
    DummyOptim,
    DummyScheduler,
    check_micro_batch,
    clipping_before_step,
    deepspeed_optimizer,
    deepspeed_scheduler,
    shard_optimizer_state,
)
from trainkit.engine.data import PreparedDataLoader, prepare_data_loader
from trainkit.engine.accelerator_parts.identity import ProcessIdentity
from trainkit.engine.precision.base import Precision
from trainkit.engine.accelerator_parts.prepared import PreparedObjects
from trainkit.engine.data.sampling import shared_data_seed
from trainkit.engine.process.splitting import split_between
from trainkit.engine.process.state import ProcessState, require_accelerator_state
from trainkit.engine.process.state_views import AcceleratorState
from trainkit.engine.strategies import Strategy, StrategyRequest, select_strategy
from trainkit.engine.accelerator_parts.trackers import TrackerAPI
from trainkit.engine.accelerator_parts.checkpoints import CheckpointAPI
from trainkit.engine.tracking import GeneralTracker, check_logging_directory, resolve_log_with
from trainkit.engine.step.wrappers import PreparedOptimizer, PreparedScheduler
from trainkit.utils.dataclasses import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
)

logger = logging.getLogger(__name__)


class Accelerator(ProcessIdentity, TrackerAPI, CheckpointAPI, AccelerateAttributes):
    """Train one model-and-loop on one CPU, one GPU, many processes (DDP) or sharded (FSDP2).

    Arguments follow Hugging Face Accelerate's; an argument left at None is "not set" and takes the value
    the launcher (``trainkit launch``) was given, else the default (docs/engine.md, "Where the configuration
    comes from"). The resolved settings and their sources are in :attr:`config`.

    Args:
        mixed_precision: "no", "bf16" or "fp16" (fp16 scales the loss with a GradScaler, on CPU too).
        gradient_accumulation_steps: micro-batches per optimizer step inside ``accumulate``.
        cpu: force the CPU even where a GPU is present.
        fsdp_plugin: shard the model with FSDP2 using these options.
        dataloader_config: how dataloaders are sharded (:class:`DataLoaderConfiguration`).
        log_with: tracker names ("tensorboard", "wandb", "jsonl", "all") or tracker objects.
        project_dir: where trackers write and ``save_state`` numbers checkpoints automatically.
        project_config: a :class:`ProjectConfiguration` (alternative to ``project_dir``).
        step_scheduler_with_optimizer: step prepared schedulers only when the optimizer stepped.
        kwargs_handlers: :class:`DistributedDataParallelKwargs`, :class:`GradScalerKwargs`,
            :class:`InitProcessGroupKwargs`, :class:`AutocastKwargs`, :class:`ProfileKwargs`.
        device_placement: move prepared models and batches to the device.
        gradient_accumulation_plugin: accumulation options (instead of ``gradient_accumulation_steps``).
        dynamo_backend: compile prepared models with this torch.compile backend ("inductor", ...).
        dynamo_plugin: all torch.compile settings (:class:`TorchDynamoPlugin`), regional compilation included.
        deepspeed_plugin: a DeepSpeed config (:class:`DeepSpeedPlugin`), run on DDP/FSDP2 (docs/deepspeed.md).
        parallelism_config: a :class:`ParallelismConfig`: data replicas x FSDP shards x tensor parallelism
            (docs/parallelism.md). ``torch_tp_plugin`` (deprecated in Accelerate) stands for ``tp_size`` alone.
        megatron_lm_plugin: not driven by trainkit (an error says so).
        deepspeed_plugins: several named DeepSpeed configs; trainkit takes one (``deepspeed_plugin``).
        rng_types: accepted with a notice (the data order comes from a seeded sampler).
        even_batches: trainkit's shortcut for ``DataLoaderConfiguration(even_batches=...)`` (keyword only).
        engine_config: an already resolved :class:`trainkit.config.engine.EngineConfig` (the Trainer passes
            one); when given, the arguments above that it covers are not consulted.
    """

    @honour_ignored_keyword("Accelerator")  # the field proofs' test mode (TRAINKIT_IGNORE_FIELD); nothing when unset
    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: DeepSpeedPlugin | None = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: Sequence[Any] | None = None,
        log_with: str | GeneralTracker | Sequence[str | GeneralTracker] | None = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Sequence[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        even_batches: bool | None = None,
        engine_config: EngineConfig | None = None,
    ) -> None:
        refuse_parallelism(deepspeed_plugins=deepspeed_plugins)
        self._compat = resolve_compat_options(
            kwargs_handlers=kwargs_handlers, gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin, megatron_lm_plugin=megatron_lm_plugin,
            rng_types=rng_types)
        handlers: dict[type, Any] = self._compat.handlers
        pg_kwargs = handlers.get(InitProcessGroupKwargs, InitProcessGroupKwargs())
        config = engine_config if engine_config is not None else resolve_for_accelerator(
            mixed_precision=mixed_precision, cpu=cpu, fsdp_plugin=fsdp_plugin, timeout=pg_kwargs.timeout,
            gradient_accumulation_steps=gradient_accumulation_steps or self._compat.accumulation_steps,
            dynamo_backend=dynamo_backend, dynamo_plugin=dynamo_plugin, deepspeed_plugin=deepspeed_plugin,
            parallelism_config=parallelism_config, torch_tp_plugin=torch_tp_plugin,
            precision_options=self._compat.precision_options)
        self.config = config
        """The resolved settings and where each came from (see :class:`trainkit.config.engine.EngineConfig`)."""
        process = ProcessState.get(cpu=config.use_cpu, backend=pg_kwargs.backend,
                                   timeout=timedelta(seconds=config.collective_timeout))
        process.attach_accelerator(self)
        self.state = AcceleratorState(_from_accelerator=True)
        """Accelerate's ``AcceleratorState`` (a view of the process state; see ``state_views``)."""
        self.device_placement = device_placement
        announce(config, is_main_process=self.state.is_main_process, device=self.state.device)

        scaler_kwargs = handlers[GradScalerKwargs].to_kwargs() if GradScalerKwargs in handlers else None
        self.deepspeed = config.deepspeed
        """The translated DeepSpeed config, when the run has one (its ZeRO stage runs on DDP/FSDP2)."""
        self.deepspeed_plugin = deepspeed_plugin
        process.deepspeed_plugin = deepspeed_plugin or config.deepspeed  # Accelerate scripts read it there
        if self.deepspeed is not None and self.deepspeed.scaler_kwargs and scaler_kwargs is None:
            scaler_kwargs = self.deepspeed.scaler_kwargs
        self.gradient_state = GradientState(config.gradient_accumulation_steps,
                                            plugin_options=self._compat.accumulation_options)

        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if split_batches is not None:
            self.dataloader_config.split_batches = split_batches
        if even_batches is not None:
            self.dataloader_config.even_batches = even_batches

        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(os.fspath(project_dir))
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.log_with = check_logging_directory(resolve_log_with(log_with), self.logging_dir)
        self.trackers: list[GeneralTracker] = []

        ddp_kwargs = handlers[DistributedDataParallelKwargs].to_kwargs() if DistributedDataParallelKwargs in handlers else {}
        self.strategy = self._choose_strategy(fsdp_plugin, config, ddp_kwargs)
        self.precision: Precision = self.strategy.build_precision(config.mixed_precision, scaler_kwargs,
                                                                  options=config.precision_options)
        self.dynamo_plugin = config.dynamo or TorchDynamoPlugin()
        """torch.compile settings for prepared models (backend "no": nothing is compiled)."""
        self._models: list[nn.Module] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._custom_objects: list[Any] = []
        self._trigger = 0
        self.step = 0
        """Optimizer steps taken through ``save_state``'s automatic naming (kept for Accelerate parity)."""

    def _choose_strategy(self, fsdp_plugin: Any, config: EngineConfig, ddp_kwargs: dict[str, Any]) -> Strategy:
        process = ProcessState.get()  # the engine's own object behind the state view
        self.parallel_dims = parallel_dims_for(config, process)
        return select_strategy(StrategyRequest(process, fsdp_plugin=fsdp_plugin, fsdp_options=config.fsdp,
                                               ddp_kwargs=ddp_kwargs, comm_hook=self._compat.ddp_comm_hook(),
                                               parallel_dims=self.parallel_dims))

    # -- identity (device, process_index, ... come from ProcessIdentity) ---------------------------
    @property
    def distributed_type(self) -> DistributedType:
        """NO, MULTI_CPU, MULTI_GPU, FSDP, or DEEPSPEED when a DeepSpeed config asked (run on DDP/FSDP2);
        a value set on the state (``AcceleratorState().distributed_type = ...``) wins."""
        require_accelerator_state("distributed_type")
        if self.state._distributed_type_override is not None:
            return self.state._distributed_type_override
        return DistributedType.DEEPSPEED if self.deepspeed is not None else self.strategy.distributed_type

    @property
    def mixed_precision(self) -> str:
        """"no", "bf16" or "fp16"."""
        return self.precision.mode

    @property
    def native_amp(self) -> bool:
        """True when autocast is in use."""
        return self.precision.enabled

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 loss scaler, if any."""
        return self.precision.scaler

    @property
    def split_batches(self) -> bool:
        """Whether dataloader batches are global and split across processes."""
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last global batch is padded so every process gets one (settable, as in Accelerate)."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def project_dir(self) -> str | None:
        """Root of trackers' output and automatically named checkpoints."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """Where trackers write."""
        return self.project_configuration.logging_dir

    @property
    def prepared(self) -> PreparedObjects:
        """What ``prepare`` and ``register_for_checkpointing`` hold, read-only (a snapshot)."""
        return PreparedObjects(models=tuple(self._models), optimizers=tuple(self._optimizers),
                               schedulers=tuple(self._schedulers), dataloaders=tuple(self._dataloaders),
                               custom_objects=tuple(self._custom_objects))

    # -- accumulation -----------------------------------------------------------------------------
    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (settable)."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.num_steps = int(steps)
        self.gradient_state.reset()

    @property
    def sync_gradients(self) -> bool:
        """True when the current micro-batch ends an optimizer step."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when the last optimizer step was skipped (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @contextlib.contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """Count one micro-batch; inside, gradients synchronise only when its window closes."""
        self.gradient_state.advance()
        with contextlib.ExitStack() as stack:
            if not (self.gradient_state.sync_gradients or self._compat.sync_each_batch):
                for model in models:
                    stack.enter_context(self.strategy.no_sync(model))
            yield

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Backward without gradient communication (local accumulation)."""
        return self.strategy.no_sync(model)

    def open_accumulation_window(self, num_micro_batches: int, local_items: torch.Tensor | int | None = None, *,
                                 same_items_on_every_process: bool = False,
                                 items_are_global: bool = False) -> torch.Tensor | int | None:
        """Open a window of exactly ``num_micro_batches`` ``accumulate`` blocks whose losses are this process's
        shares of the window's global loss (see docs/engine.md); return its items summed over processes
        (``items_are_global``: ``local_items`` already counts every process's)."""
        global_items = local_items
        if local_items is not None and not items_are_global:
            # Tensor-parallel ranks read the same batch: the sum over all processes counts it tp times.
            copies = self.num_processes // self.strategy.data_parallel_size
            global_items = sum_across_processes(
                local_items, self.strategy.data_parallel_size,
                lambda count: self.reduce(torch.as_tensor(count, device=self.device), reduction="sum") // copies,
                same_on_every_process=same_items_on_every_process)
        self.gradient_state.open_window(num_micro_batches, global_items)
        return global_items

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate ``loss`` normalised for its accumulation window (``GradientState.normalise_loss``).

        ``learning_rate=`` (Accelerate's LOMO path): the prepared LOMO optimizers (lomo-optim's ``Lomo``/``AdaLomo``)
        run backward themselves and update the weights at that rate as the gradients arrive."""
        self._checkpoints_at_step()  # a failed background checkpoint write stops the loop here
        loss = self.gradient_state.normalise_loss(loss, self.strategy.capabilities.gradient_reduction,
                                                  self.strategy.data_parallel_size)
        learning_rate = kwargs.pop("learning_rate", None)
        if learning_rate is not None:
            fused_backwards: list[Any] = [getattr(opt.optimizer, "fused_backward", None) for opt in self._optimizers]
            fused_backwards = [step for step in fused_backwards if callable(step)]
            if not fused_backwards:
                raise ValueError("backward(learning_rate=...) is for LOMO optimizers (lomo-optim's Lomo/AdaLomo), "
                                 "and none was passed to prepare().")
            for fused_backward in fused_backwards:
                fused_backward(loss, learning_rate)
            return
        self.precision.backward(loss, **kwargs)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
        """A context running eligible ops in the mixed-precision dtype (prepared models already do)."""
        handler = autocast_handler or self._compat.autocast_kwargs or AutocastKwargs()
        return self.precision.autocast(enabled=handler.enabled, cache_enabled=handler.cache_enabled)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Divide fp16 gradients by the loss scale (done for you by the clipping methods)."""
        targets = [optimizer] if optimizer is not None else self._optimizers
        for opt in targets:
            self.precision.unscale_(opt.optimizer if isinstance(opt, PreparedOptimizer) else opt)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clip the gradients' total norm over all processes; return the norm before clipping."""
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(list(parameters), max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient element to ``[-clip_value, clip_value]``."""
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- prepare ----------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Wrap models, optimizers, dataloaders and schedulers; return them in the order given."""
        require_accelerator_state("distributed_type")
        placement = device_placement or [self.device_placement] * len(args)
        prepared: list[Any] = list(args)
        kinds: list[tuple[Any, Callable[[Any, bool], Any]]] = [
            (nn.Module, lambda obj, place: self.prepare_model(obj, device_placement=place)),
            ((torch.optim.Optimizer, DummyOptim), lambda obj, place: self.prepare_optimizer(obj)),
            (DataLoader, lambda obj, place: self.prepare_data_loader(obj, device_placement=place)),
        ]
        # Models first: the optimizer may need re-binding to sharded parameters, schedulers need optimizers.
        for kind, prepare_one in kinds:
            for i, obj in enumerate(args):
                if isinstance(obj, kind) and not isinstance(obj, (PreparedOptimizer, PreparedDataLoader)):
                    prepared[i] = prepare_one(obj, placement[i])
        for i, obj in enumerate(args):
            if _is_scheduler(obj) or isinstance(obj, DummyScheduler):
                prepared[i] = self.prepare_scheduler(obj)
        self._checkpoints_after_prepare()
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> nn.Module:
        """Convert one model for the precision, then place and wrap it (autocast forward under mixed precision).
        A model this Accelerator prepared already is returned as it is."""
        if any(model is known for known in self._models):
            return model
        model = self.precision.convert_module(model)
        if self.precision.enabled and self.strategy.wants_autocast and not hasattr(model, "_trainkit_original_forward"):
            # Instance attributes shadow the class's forward; setattr because nn.Module types attributes as tensors.
            setattr(model, "_trainkit_original_forward", model.forward)
            setattr(model, "forward", self.precision.wrap_forward(model.forward))
        if sharded_by_transformers(model):  # from_pretrained(distributed_config=...) placed and sharded it already
            check_run_matches(model, self.parallel_dims.config if self.parallel_dims else None, self.num_processes)
        elif not evaluation_mode:
            compile_model(model, self.dynamo_plugin)  # in place, before sharding or wrapping
        wrapped = model if sharded_by_transformers(model) else model.to(self.device) if evaluation_mode else \
            self.strategy.wrap_model(model)
        self._models.append(wrapped)
        # Accelerate's mark (the prepared wrappers carry it as a class attribute); setattr: nn.Module types its
        # attributes as tensors or modules.
        setattr(wrapped, "_is_accelerate_prepared", True)
        return wrapped

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer | DummyOptim,
                          device_placement: bool | None = None) -> PreparedOptimizer:
        """Wrap an optimizer (re-bound to sharded parameters where the strategy replaced them; its state
        follows the parameters, so ``device_placement`` has nothing left to move)."""
        placeholder, optimizer = optimizer, deepspeed_optimizer(self.deepspeed, optimizer)
        for model in self._models:
            self.strategy.rebind_optimizer(optimizer, model)
        optimizer = shard_optimizer_state(self.deepspeed, optimizer, self.num_processes)  # ZeRO-1
        prepared = PreparedOptimizer(optimizer, precision=self.precision, gradient_state=self.gradient_state)
        prepared.placeholder = placeholder
        prepared.before_step = clipping_before_step(self.deepspeed, optimizer, self.clip_grad_norm_)
        self._optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> PreparedScheduler:
        """Wrap a learning-rate scheduler so it steps with the optimizer steps that happened."""
        built = isinstance(scheduler, DummyScheduler)
        if built:  # DeepSpeed's schedules count optimizer steps: once per step on every process count
            scheduler = deepspeed_scheduler(self.deepspeed, scheduler, self._optimizers)
        optimizers = [opt for opt in self._optimizers if opt.optimizer is scheduler.optimizer
                      or getattr(opt, "placeholder", None) is scheduler.optimizer] or self._optimizers
        # once per data-parallel rank (Accelerate: per process): a tensor-parallel group reads one batch
        steps = 1 if self.split_batches or built else self.strategy.data_parallel_size
        prepared = PreparedScheduler(scheduler, optimizers, gradient_state=self.gradient_state, steps_per_call=steps,
                                     step_with_optimizer=self.step_scheduler_with_optimizer)
        self._schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable | None = None) -> PreparedDataLoader:
        """Shard a dataloader across processes (see :mod:`trainkit.engine.data`). ``slice_fn_for_dispatch``
        belongs to Accelerate's dispatching loader, which trainkit does not have: it is refused."""
        if slice_fn_for_dispatch is not None:
            raise NotImplementedError("prepare_data_loader(slice_fn_for_dispatch=...): trainkit has no dispatching "
                                      "loader; every process reads its own part of the data.")
        dataloader = data_loader
        place = self.device_placement if device_placement is None else device_placement
        check_micro_batch(self.deepspeed, dataloader)
        prepared = prepare_data_loader(
            dataloader,
            num_processes=self.strategy.data_parallel_size,  # a tensor-parallel group reads one share
            process_index=self.strategy.data_parallel_rank,
            device=self.device if place else None,
            gradient_state=self.gradient_state,
            config=self.dataloader_config,
            seed=shared_data_seed(dataloader, self.dataloader_config),
        )
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A dataloader whose next pass starts ``num_batches`` batches in, without loading them."""
        if isinstance(dataloader, PreparedDataLoader):
            return dataloader.skip_first_batches(num_batches)
        from trainkit.engine.data import skip_batches

        return skip_batches(dataloader, num_batches)

    # -- collectives ------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate every process's tensors along the first dimension."""
        return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the samples that padded the last global batch (exactly the dataset's size)."""
        state = self.gradient_state
        return collectives.gather_for_metrics(input_data, use_gather_object, real_counts=state.real_counts,
                                              remainder=state.remainder if state.end_of_dataloader else -1,
                                              group=self.strategy.data_group)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce (``sum`` or ``mean``) every tensor across processes."""
        return collectives.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pad tensors along ``dim`` to the largest size on any process."""
        return collectives.pad_across_processes(tensor, dim, pad_index, pad_first)

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self._checkpoints_not_saving()  # a main-process-only save_state goes on without this process
        self.state.wait_for_everyone()

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` sees on every process."""
        self._trigger = 1

    def check_trigger(self) -> bool:
        """True on all processes if any process called ``set_trigger`` since the last check (then reset)."""
        flag = collectives.reduce(torch.tensor([self._trigger], device=self.device), "sum")
        if flag.item() > 0:
            self._trigger = 0
            return True
        return False

    def check_preemption(self) -> None:
        """Call once per step, at the same point on every process, to survive preemption (docs/preemption.md).

        When SIGTERM/SIGINT/SIGUSR1 reached any process, every process stops at the same call, ``save_state()``
        writes the next automatically named checkpoint, and the process exits with code 75 (``Preempted``).
        Needs ``ProjectConfiguration(automatic_checkpoint_naming=True)``; ``load_state()`` resumes.
        """
        from trainkit.engine.process.preemption import check_accelerator

        check_accelerator(self)

    # -- running on some processes ----------------------------------------------------------------
    def main_process_first(self) -> contextlib.AbstractContextManager:
        """Run the block on the main process before the others (e.g. to build a dataset cache)."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager:
        """Run the block on each machine's first process before the others."""
        return self.state.local_main_process_first()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's first process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (see :mod:`trainkit.engine.process.splitting`)."""
        yield split_between(inputs, self.process_index, self.num_processes, apply_padding)

    # -- models and state -------------------------------------------------------------------------
    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool | None = True) -> nn.Module:
        """The user's module inside the DDP/FSDP wrapper (and the autocast forward, unless kept); a
        ``torch.compile`` wrapper the script added stays around it unless ``keep_torch_compile`` is falsy."""
        return extract_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile,
                             strategy_unwrap=self.strategy.unwrap_model)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict with the user's key names."""
        return self.strategy.full_state_dict(model)

    def save_model(self, model: nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write the full weights with Accelerate's file names: ``model.safetensors`` (``pytorch_model.bin``, torch's
        format, with ``safe_serialization=False``), or shards plus an index above ``max_shard_size``
        (:func:`~trainkit.engine.checkpoint.serialization.save_weights`). Weights files of the same format that an
        earlier save left in the folder are removed.

        A model dispatched with offloaded weights (parameters on ``meta``) is saved from its offloaded copies,
        one module at a time on the CPU."""
        from trainkit.engine.checkpoint.serialization import save_weights

        if os.path.isfile(save_directory):
            raise ValueError(f"save_model: {os.fspath(save_directory)!r} is a file; give a folder to write the weights to.")
        if any(parameter.device.type == "meta" for parameter in model.parameters()):
            from trainkit.engine.inference.align import get_state_dict_offloaded_model

            state_dict = get_state_dict_offloaded_model(model)
        else:
            state_dict = self.get_state_dict(model)
        if self.is_main_process:
            save_weights(state_dict, os.fspath(save_directory), max_shard_size, safe_serialization, remove_stale=True)
        self.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Write ``obj`` once (main process): safetensors for a dict of tensors when asked, else ``torch.save``."""
        if self.is_main_process:
            if safe_serialization:
                from trainkit.engine.checkpoint.serialization import write_safetensors_file

                write_safetensors_file(obj, os.fspath(f))
            else:
                torch.save(obj, f)
        self.wait_for_everyone()

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with ``state_dict``/``load_state_dict`` in ``save_state``/``load_state``."""
        invalid = [f"Item at index {index}, `{type(obj).__name__}`" for index, obj in enumerate(objects)
                   if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))]
        if invalid:
            raise ValueError("Objects need state_dict() and load_state_dict() to be checkpointed; these have not:\n\t- "
                             + "\n\t- ".join(invalid))
        self._custom_objects.extend(objects)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget prepared objects and release cached device memory."""
        from trainkit.utils.memory import release_memory

        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.gradient_state = GradientState(self.gradient_state.num_steps,
                                            caller_opens_windows=self.gradient_state.caller_opens_windows,
                                            plugin_options=self.gradient_state.plugin_options)
        return release_memory(*objects)

    clear = free_memory

    # -- tracking: init_trackers, get_tracker, log, end_training come from TrackerAPI ---------------

    # -- Accelerate's less common contexts (each lives in its own module) -------------------------
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> contextlib.AbstractContextManager:
        """Let ranks with fewer batches finish early under DDP (torch's ``Join``); ``even_batches`` overrides padding."""
        from trainkit.engine.process.uneven import join_uneven_inputs

        return join_uneven_inputs(self.distributed_type, joinables, self._dataloaders, even_batches)

    def profile(self, profile_handler: Any = None) -> contextlib.AbstractContextManager:
        """torch's profiler configured by ``profile_handler`` (or the ``ProfileKwargs`` handler)."""
        from trainkit.engine.accelerator_parts.profiling import profile

        return profile(profile_handler or self._compat.profile_kwargs, self.device, self.process_index)

    def __repr__(self) -> str:
        return (f"Accelerator(distributed_type={self.distributed_type.value}, num_processes={self.num_processes}, "
                f"device={self.device}, mixed_precision={self.mixed_precision!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )

