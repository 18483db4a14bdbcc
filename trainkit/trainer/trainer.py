"""The Trainer: transformers' Trainer API over trainkit's engine, with a training loop read in one sitting.

``train()`` calls the hooks transformers' Trainer calls, in its order and with its arguments, so a subclass
that overrides one sees it called where it expects (docs/trainer.md lists them):

    train → [_load_from_checkpoint] → _inner_training_loop
      get_train_dataloader, set_initial_training_values, _init_training_state, _prepare_for_training
        (create_optimizer, _wrap_model, create_scheduler, [resume: the engine's state])
      per epoch: _run_epoch
        per optimizer step: get_batch_samples, then per micro-batch training_step
          (_prepare_inputs, compute_loss_context_manager, compute_loss), floating_point_ops, _track_num_input_tokens;
          _clip_grad_norm, the optimizer and schedule, _maybe_log_save_evaluate (log, _evaluate, _save_checkpoint)
      _finalize_training (log, _load_best_model)

The concepts around the loop live in mixins, one module each: DataLoaders and batches (:mod:`.loaders`), the
run's size (:mod:`.plan`), logs and accounting (:mod:`.reporting`), evaluation (:mod:`.evaluation`), saving and
loading (:mod:`.saving`). Accumulation is the engine's: ``get_batch_samples`` opens each window of micro-batches
in the engine (which counts its loss items on every process and decides when gradients sync); the Trainer keeps
only its weighting policy: each micro-batch's mean loss weighted by its share of the window's items.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from trainkit.engine import DistributedType, caller_opens_accumulation_windows

from . import hyperparameter_search as hp_search, loss_items, optim
from .callbacks import (CallbackHandler, DefaultFlowCallback, PrinterCallback, ProgressCallback, TrackerCallback,
                        TrainerControl, TrainerState, add_to_next_tracker_log, exported_states)
from .checkpointing import files as checkpoints, preemption, resume
from .checkpointing.manager import CheckpointManager
from .construction_checks import check_trainer_inputs
from .data import ItemCounter, call_model, default_collator, default_label_names, loss_from_outputs
from .evaluation import EvaluationMethods, speed_metrics
from .hooks import announce_overridden_hooks
from .loaders import DataLoaderMethods
from .loss_items import label_smoothed_loss, label_smoother
from .memory import batch_size_to_resume, maybe_empty_cache, memory_tracker, train_with_batch_size_search
from .meter import TrainingMeter, flops_parameters, throughput_logs, training_logs
from .model_features import prepare_model_features
from .neftune import neftune_while_training
from .schedules import build_scheduler, replan_schedule
from .plan import PlanMethods, length_or_none, loader_epoch, log_plan, window_sizes
from .reporting import ReportingMethods, apply_log_level
from .sampling import SamplingHooks, seed_run
from .saving import SavingMethods
from .training_arguments.arguments import TrainingArguments
from .training_arguments.deepspeed import scheduler_from_config

logger = logging.getLogger(__name__)


class TrainOutput(NamedTuple):
    """What ``Trainer.train`` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class Trainer(SamplingHooks, DataLoaderMethods, PlanMethods, ReportingMethods, EvaluationMethods, SavingMethods,
              hp_search.HyperparameterSearchMethods):
    """Train, evaluate and predict with a model on one or many processes (see docs/trainer.md).

    Args follow transformers' Trainer: ``model`` (or ``model_init``), ``args``, ``data_collator``,
    ``train_dataset``, ``eval_dataset`` (or a dict of them), ``processing_class``, ``compute_loss_func``,
    ``compute_metrics``, ``callbacks``, ``optimizers=(optimizer, scheduler)``,
    ``optimizer_cls_and_kwargs`` and ``preprocess_logits_for_metrics``. ``hyperparameter_search`` and its
    hooks come from :class:`~trainkit.trainer.hyperparameter_search.HyperparameterSearchMethods`.
    """

    model_accepts_loss_kwargs: bool
    """transformers' attribute: the model takes ``num_items_in_batch`` (its ``accepts_loss_kwargs``, else ``**kwargs``)."""
    loss_is_scaled_for_ga: bool | None = None
    """True when ``compute_loss`` returns a loss already divided by ``num_items_in_batch`` (the window's item
    count on all processes); otherwise it is taken as the mean over its micro-batch and weighted here.
    None: True exactly when a ``compute_loss_func`` is given."""

    def __init__(self, model: nn.Module | None = None, args: TrainingArguments | None = None,
                 data_collator: Callable | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, model_init: Callable[[], nn.Module] | None = None,
                 compute_loss_func: Callable | None = None, compute_metrics: Callable | None = None,
                 callbacks: list | None = None, optimizers: tuple = (None, None),
                 optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None,
                 preprocess_logits_for_metrics: Callable | None = None) -> None:
        self.args = args if args is not None else TrainingArguments()
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else default_collator(processing_class)
        self.model_init = model_init
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._validate_args()  # datasets and functions against the strategies: before a model is built
        seed_run(self.args)  # before model_init, so its initial weights are reproducible
        self._deepspeed: Any = None  # the translated TrainingArguments(deepspeed=...), when given
        self.is_in_train = False
        self._memory_tracker = memory_tracker(self.args)
        self._memory_tracker.start()  # named by its caller (__init__, train, evaluate): transformers' stages
        self._loaded_model = model  # read by create_accelerator: a model transformers sharded sets the layout
        self.create_accelerator_and_postprocess()
        apply_log_level(self.args)
        self.hub: Any = None
        self.hub_model_id: str | None = None
        if self.args.push_to_hub:
            self.init_hf_repo()  # fails here, before any training, when the Hub is unreachable
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model or a model_init function.")
            model = self.call_model_init()
        self.model = self.model_wrapped = model
        self._model_prepared = self._optimizer_prepared = False
        self.label_names = self.args.label_names or default_label_names(model)
        self.label_smoother = label_smoother(self.args, model)
        self.main_input_name = getattr(model, "main_input_name", "input_ids")
        self._count_items = ItemCounter(model, self.label_names)
        loss_items.set_policy(self, model)  # model_accepts_loss_kwargs & co., as transformers decides them
        self._num_parameters = flops_parameters(model)
        self._train_batch_size = self.args.per_device_train_batch_size  # or what auto_find_batch_size found
        self._signature_columns: list[str] | None = None
        self._eval_dataloaders: dict[Any, Any] = {}
        self._engine_saved_weights_to: str | None = None
        self._preemption_watch: PreemptionWatch | None = None  # while train() runs (checkpointing/preemption.py)
        self._resume_point = resume.START
        self.current_flos = 0.0
        self.checkpoint_manager = CheckpointManager(self)
        """Saves, resume point, rotation and the best model: every checkpoint goes through it."""
        self.callback_handler = CallbackHandler([DefaultFlowCallback, *(callbacks or [])], self.model,
                                                processing_class, self.optimizer, self.lr_scheduler)
        self.add_callback(PrinterCallback if self.args.disable_tqdm else ProgressCallback)
        self.callback_handler.engine_callbacks.append(TrackerCallback(self.accelerator))
        self.control = TrainerControl()
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero(),
                                  stateful_callbacks=exported_states(self._stateful_callbacks()))
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        self._memory_tracker.stop_and_update_metrics()

    def _validate_args(self) -> None:
        """Fail now for datasets or functions that cannot serve the arguments' strategies (see construction_checks)."""
        check_trainer_inputs(type(self), self.args, train_dataset=self.train_dataset, eval_dataset=self.eval_dataset,
                             compute_metrics=self.compute_metrics, data_collator=self.data_collator)
        announce_overridden_hooks(type(self))  # a transformers hook trainkit never calls: say so now
        if self.optimizer_cls_and_kwargs is not None and self.optimizer is not None:
            raise RuntimeError("Trainer got both optimizers=(optimizer, ...) and optimizer_cls_and_kwargs: pass one.")

    # ------------------------------------------------------------------ engine and process identity

    def create_accelerator_and_postprocess(self) -> None:
        """Build the engine from the arguments (``self.accelerator``); the run's settings are then
        ``accelerator.config`` (the arguments are never written to: see trainer/training_arguments/engine_settings.py)."""
        if self.args.deepspeed is not None:
            from .training_arguments.deepspeed import deepspeed_for_trainer

            self._deepspeed = deepspeed_for_trainer(self.args)
        self.accelerator = self.create_accelerator()
        self.gather_function = self.accelerator.gather_for_metrics
        self.is_fsdp_enabled = self.accelerator.distributed_type == DistributedType.FSDP
        self.is_deepspeed_enabled = self.accelerator.distributed_type == DistributedType.DEEPSPEED

    def create_accelerator(self):
        """A new engine configured from the arguments (``_build_accelerator_args``)."""
        from trainkit.engine import Accelerator

        accelerator = Accelerator(**self._build_accelerator_args())
        caller_opens_accumulation_windows(accelerator)  # the Trainer opens each window itself
        return accelerator

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """The ``Accelerator(...)`` keywords the arguments decide (``kwargs`` added over them)."""
        from .training_arguments.engine_settings import accelerator_arguments

        deepspeed_plugin = self._deepspeed.plugin if self._deepspeed else None
        model = getattr(self, "model", None) or getattr(self, "_loaded_model", None)  # the model to train, once known
        return {**accelerator_arguments(self.args, deepspeed_plugin, model=model), **kwargs}

    def is_world_process_zero(self) -> bool:
        """True on the one process that writes logs, checkpoints' JSON and prints."""
        return self.accelerator.is_main_process

    def is_local_process_zero(self) -> bool:
        """True on the first process of each machine."""
        return self.accelerator.is_local_main_process

    def add_callback(self, callback) -> None:
        """Add a callback (instance or class)."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        """Remove and return a callback (instance or class)."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback) -> None:
        """Remove a callback (instance or class)."""
        self.callback_handler.remove_callback(callback)

    def end(self) -> None:
        """Finish the trackers. Call it once at the end of a script, after everything that needs the processes."""
        self.accelerator.end_training()

    # ------------------------------------------------------------------ model, optimizer and schedule

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """The optimizer ``optimizer_cls_and_kwargs``, a DeepSpeed config or ``args.optim`` names, over ``model``
        (default: the Trainer's), unless one was given; ``args.optim`` is resolved by the installed transformers
        (:meth:`get_optimizer_cls_and_kwargs`)."""
        if self.optimizer is None:
            self.optimizer = optim.create_optimizer(self, self.model if model is None else model)
        return self.optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None) -> tuple[Any, Any]:
        """The optimizer class and keyword arguments ``args.optim`` names, as the installed transformers'
        ``Trainer.get_optimizer_cls_and_kwargs`` resolves them (its own code; see trainer/optim.py)."""
        return optim.optimizer_cls_and_kwargs(args, model)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters weight decay applies to (transformers' rule: not biases nor norm weights)."""
        return optim.decay_parameter_names(model)

    def get_optimizer_group(self, param: str | nn.Parameter | None = None):
        """The optimizer's param group holding ``param``, or every group's parameters (as transformers')."""
        return optim.optimizer_group(self, param)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """The ``args.lr_scheduler_type`` schedule over ``num_training_steps`` steps, unless one was given."""
        if self.lr_scheduler is None:
            optimizer = optimizer or self.optimizer
            self.lr_scheduler = (scheduler_from_config(self._deepspeed, optimizer, self.args, num_training_steps)
                                 or build_scheduler(optimizer, self.args, num_training_steps))
            self._scheduled_steps = num_training_steps
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Both of the above (the order transformers uses)."""
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module:
        """The module to train or evaluate: ``model`` itself (the engine wraps it for the strategy in ``prepare``).
        A subclass may return a wrapper of its own; the engine prepares whatever this returns."""
        return model

    def _prepare_model(self, model: nn.Module | None = None) -> None:
        """Have the engine prepare ``model`` (default: the Trainer's) once: the model features the arguments ask
        for, the strategy's wrapper, compilation."""
        if self._model_prepared:
            return
        model = self.model if model is None else model
        prepare_model_features(self, model)
        wrapped = self.accelerator.prepare(model)  # compiles in place when torch_compile is set
        self.model_wrapped = wrapped
        self.model = self.accelerator.unwrap_model(wrapped)
        self.callback_handler.model = self.model
        self._model_prepared = True

    def _loads_weights_after_wrapping(self) -> bool:
        """Sharded strategies load checkpoint weights into the prepared model; others before it (transformers' rule)."""
        return self.is_fsdp_enabled or self.is_deepspeed_enabled

    # ------------------------------------------------------------------ training

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
        """Train for ``max_steps`` or ``num_train_epochs``; resume from a checkpoint folder, or the latest with True
        (and, after a torchelastic restart, from the latest by itself unless told False)."""
        hp_search.start_trial(self, trial)  # a trial's fresh model, arguments and engine (hyperparameter_search)
        self._memory_tracker.start()
        self.is_in_train = True
        try:
            folder = self.checkpoint_manager.resume_folder(resume_from_checkpoint)
            if folder is not None and not self._loads_weights_after_wrapping():
                self._load_from_checkpoint(folder)
            batch_size_to_resume(self, folder)  # the batch size the checkpointed run found to fit
            run = functools.partial(self._inner_training_loop, args=self.args, resume_from_checkpoint=folder,
                                    trial=trial, ignore_keys_for_eval=ignore_keys_for_eval)
            with neftune_while_training(self.model, self.args.neftune_noise_alpha):
                if self.args.auto_find_batch_size:
                    return train_with_batch_size_search(self, run, self._train_batch_size)
                return run(batch_size=self._train_batch_size)
        finally:
            self.is_in_train = False

    def _update_auto_batch_size(self, batch_size: int) -> None:
        """Train with ``batch_size`` per process (``auto_find_batch_size`` halves it after an out-of-memory error)."""
        self._train_batch_size = batch_size

    def _inner_training_loop(self, batch_size: int | None = None, args: TrainingArguments | None = None,
                             resume_from_checkpoint: str | None = None, trial: Any = None,
                             ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
        """The run: plan it, set up the model, optimizer and schedule (and the resumed state), then the epochs."""
        args = self.args if args is None else args
        if args.auto_find_batch_size and batch_size is not None:
            self._update_auto_batch_size(batch_size)
        train_dataloader = self.get_train_dataloader()
        if resume_from_checkpoint:  # another world size: the same global batch, before the run's length is planned
            resume.keep_global_batch_on_resume(self, resume_from_checkpoint, train_dataloader)
        values = self.set_initial_training_values(args, train_dataloader)
        (num_train_epochs, num_update_steps_per_epoch, _, num_train_samples, _, steps_in_epoch, max_steps) = values
        sized = length_or_none(train_dataloader) is not None
        self._update_steps_per_epoch = num_update_steps_per_epoch if sized else None  # where a resume continues
        epochs_trained, steps_trained_in_current_epoch = self._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial)
        model, train_dataloader = self._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        if not sized:  # a stream: the epoch is the restored loader's
            epochs_trained = loader_epoch(train_dataloader)
        log_plan(self, values, train_dataloader)
        start_time = time.time()
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._initial_global_step = self._globalstep_last_logged = self.state.global_step
        self.meter = TrainingMeter(self.accelerator, self._num_parameters)
        model.train()  # once: evaluation switches back itself, so no step pays for it
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
        with preemption.watching(self):  # SIGTERM & co.: every rank saves one checkpoint, exits 75
            for epoch in range(epochs_trained, num_train_epochs):
                self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
                self._run_epoch(model=model, epoch=epoch, train_dataloader=train_dataloader,
                                steps_in_epoch=steps_in_epoch, num_update_steps_per_epoch=num_update_steps_per_epoch,
                                trial=trial, ignore_keys_for_eval=ignore_keys_for_eval, start_time=start_time,
                                resume_from_checkpoint=resume_from_checkpoint, epochs_trained=epochs_trained,
                                steps_trained_in_current_epoch=steps_trained_in_current_epoch)
                if self.control.should_training_stop:
                    break
            return self._finalize_training(trial, num_train_samples, start_time)

    def _init_training_state(self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int,
                             resume_from_checkpoint: str | None, trial: Any) -> tuple[int, int]:
        """A fresh TrainerState, or the resumed checkpoint's (with this run's plan and its callbacks' states);
        returns (epochs done, micro-batches done in the current epoch)."""
        self.state = TrainerState(stateful_callbacks=exported_states(self._stateful_callbacks()))
        self.state.is_hyper_param_search = trial is not None
        self.state.train_batch_size = self._train_batch_size
        self.state.compute_steps(self.args, max_steps)
        epochs_trained = steps_trained_in_current_epoch = 0
        if resume_from_checkpoint is not None:
            loaded = resume.load_trainer_state(self, resume_from_checkpoint)
            self.compare_trainer_and_checkpoint_args(self.args, loaded)
            resume.warn_about_changed_plan(self, loaded, resume_from_checkpoint)
            resume.adopt_state(self, loaded)
            self._load_callback_state()
            epochs_trained = self.state.global_step // num_update_steps_per_epoch
            if not self.args.ignore_data_skip:
                steps_done = self.state.global_step % num_update_steps_per_epoch
                steps_trained_in_current_epoch = steps_done * self._accumulation_steps
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        return epochs_trained, steps_trained_in_current_epoch

    def _prepare_for_training(self, max_steps: int, train_dataloader: Any,
                              resume_from_checkpoint: str | None) -> tuple[nn.Module, Any]:
        """Optimizer, the engine's model, schedule and, when resuming, the checkpoint's engine state (optimizer,
        schedule, random states, data position); returns (the model to train, the training DataLoader)."""
        # As transformers: under FSDP the optimizer is created over the sharded parameters (an AdamW created over a
        # rank's meta-device model and re-bound after sharding trained measurably apart from the run where every
        # rank loads the weights; SGD did not); otherwise before the engine wraps the model, which re-binds it.
        delay_optimizer_creation = self.is_fsdp_enabled
        if self._optimizer_prepared:
            replan_schedule(self, max_steps)  # a new plan (auto_find_batch_size, a second train()) re-spans it
        elif not delay_optimizer_creation:
            self._scheduler_built = self.lr_scheduler is None
            self.create_optimizer()
        self._prepare_model(self._wrap_model(self.model_wrapped))
        if not self._optimizer_prepared:
            if delay_optimizer_creation:
                self._scheduler_built = self.lr_scheduler is None
                self.create_optimizer()
            self.optimizer = self.accelerator.prepare(self.optimizer)
            self.create_scheduler(num_training_steps=max_steps)
            # The schedule counts optimizer steps itself (stepped by the loop), so it is checkpointed, not prepared.
            self.accelerator.register_for_checkpointing(self.lr_scheduler)
            self._optimizer_prepared = True
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = train_dataloader
        self._resume_point = resume.START
        if resume_from_checkpoint is not None:
            if self._loads_weights_after_wrapping():
                self._load_from_checkpoint(resume_from_checkpoint, self.model_wrapped)
            self._resume_point = self.checkpoint_manager.resume(resume_from_checkpoint, train_dataloader,
                                                                self._update_steps_per_epoch)
        return self.model_wrapped, train_dataloader

    def _run_epoch(self, model: nn.Module, epoch: int, train_dataloader: Any, steps_in_epoch: int,
                   num_update_steps_per_epoch: int, trial: Any, ignore_keys_for_eval: list[str] | None,
                   start_time: float, resume_from_checkpoint: str | None, epochs_trained: int,
                   steps_trained_in_current_epoch: int) -> None:
        """One pass over the training data: an optimizer step per window of ``get_batch_samples``."""
        args, state, handler = self.args, self.state, self.callback_handler
        start = self._resume_point if epoch == epochs_trained and resume_from_checkpoint else resume.START
        epoch_iterator = iter(self._epoch_batches(train_dataloader, epoch, start.batches_to_skip))
        sized = length_or_none(train_dataloader) is not None
        trained_any, grad_norm, learning_rate = False, None, None
        pending = start.restore_random_states  # a transformers checkpoint's: restored where transformers does,
        if pending is not None and not start.batches_to_skip:  # here, or after the first window
            pending = pending()
        windows = window_sizes(train_dataloader, self._accumulation_steps,
                               num_update_steps_per_epoch if sized else None, start.steps_done_in_epoch)
        for update_step, num_batches in zip(range(start.steps_done_in_epoch, num_update_steps_per_epoch), windows):
            batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches, args.device)
            if not batch_samples:
                break
            if pending is not None:
                pending = pending()
            trained_any = True
            grad_norm, learning_rate = self._train_on_window(model, batch_samples, num_items_in_batch)
            state.global_step += 1
            state.epoch = epoch + ((update_step + 1) / num_update_steps_per_epoch if sized else 0)
            maybe_empty_cache(args, state.global_step, self.accelerator.device)
            self.control = handler.on_step_end(args, state, self.control)
            self._maybe_log_save_evaluate(self.meter.loss_sum, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                          start_time, learning_rate=learning_rate)
            preemption.at_step_boundary(self)
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
        if not trained_any and start.steps_done_in_epoch == 0:
            logger.warning("The training data gave no batch in epoch %d: training stops at step %d.", epoch,
                           state.global_step)
            self.control.should_training_stop = True
        self.control = handler.on_epoch_end(args, state, self.control)
        self._maybe_log_save_evaluate(self.meter.loss_sum, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                      start_time, learning_rate=learning_rate)

    def _epoch_batches(self, train_dataloader: Any, epoch: int, skip_batches: int) -> Iterable[Any]:
        if hasattr(train_dataloader, "set_epoch"):
            train_dataloader.set_epoch(epoch)
        if skip_batches:
            return self.accelerator.skip_first_batches(train_dataloader, skip_batches)
        return train_dataloader

    def _train_on_window(self, model: nn.Module, batch_samples: list[Any],
                         num_items_in_batch: torch.Tensor | int | None) -> tuple[Any, float]:
        """Forward and backward every micro-batch of one window (gradients exchanged after the last only), then
        the optimizer step; returns (gradient norm, learning rate of the step)."""
        args, handler = self.args, self.callback_handler
        self.control = handler.on_step_begin(args, self.state, self.control)
        self.current_gradient_accumulation_steps = len(batch_samples)
        self._window_loss_is_share = loss_items.open_window(self, batch_samples, num_items_in_batch)
        window_loss = None
        for index, inputs in enumerate(batch_samples):
            with self.accelerator.accumulate(model):
                step_loss = self.training_step(model, inputs, num_items_in_batch)
            window_loss = step_loss if window_loss is None else window_loss + step_loss
            self.current_flos += float(self.floating_point_ops(inputs))
            self._track_num_input_tokens(inputs)
            if index < len(batch_samples) - 1:
                self.control = handler.on_substep_end(args, self.state, self.control)
        assert window_loss is not None  # a window holds at least one micro-batch
        self.meter.add_step(window_loss, args.logging_nan_inf_filter)
        return self._optimizer_step(model)

    def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """Forward and backward one micro-batch; return its (detached) share of the window's mean loss.

        A loss the model (or ``compute_loss_func``) divided by ``num_items_in_batch`` is already its share, as in
        transformers; a micro-batch's own mean is weighted by its share of the window's items on all processes
        (see trainer/loss_items.py). The engine's ``backward`` turns that share into gradients of the window's
        loss, whatever the strategy's reduction.
        """
        if callable(getattr(self.optimizer, "train", None)):  # schedule-free optimizers: train mode (as transformers)
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        loss = loss_items.window_share(self, loss, inputs, num_items_in_batch)
        self.accelerator.backward(loss, **optim.backward_kwargs(self.optimizer, self.lr_scheduler))
        return loss.detach()

    def compute_loss(self, model: nn.Module, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None):
        """The micro-batch's loss: the model's own, or ``compute_loss_func(outputs, labels, num_items_in_batch=...)``."""
        # The count goes to a model that takes loss keyword arguments, as transformers hands it over.
        passed = {"num_items_in_batch": num_items_in_batch} if (
            num_items_in_batch is not None and self.model_accepts_loss_kwargs) else {}
        if self.compute_loss_func is not None and isinstance(inputs, Mapping):
            label_name = self.label_names[0]
            labels = inputs.get(label_name)
            outputs = call_model(model, {k: v for k, v in inputs.items() if k != label_name}, **passed)
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif self.label_smoother is not None and isinstance(inputs, Mapping) and self.label_names[0] in inputs:
            loss, outputs = label_smoothed_loss(self, model, inputs, num_items_in_batch, passed)
        else:
            outputs = call_model(model, inputs, **passed)
            loss = loss_from_outputs(outputs)
        return (loss, outputs) if return_outputs else loss

    def compute_loss_context_manager(self) -> contextlib.ExitStack:
        """The context every forward with a loss runs in: :meth:`autocast_smart_context_manager`'s."""
        stack = contextlib.ExitStack()
        autocast = self.autocast_smart_context_manager()
        if not isinstance(autocast, contextlib.nullcontext):
            stack.enter_context(autocast)
        return stack

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        """A no-op context: the engine's prepared model runs its forward under the mixed precision itself.
        Override it to return another context (e.g. ``torch.autocast(...)``) for every loss computation."""
        return contextlib.nullcontext()

    def _optimizer_step(self, model: nn.Module) -> tuple[Any, float]:
        args, handler = self.args, self.callback_handler
        grad_norm: Any = self._clip_grad_norm(model) if args.max_grad_norm and args.max_grad_norm > 0 else None
        grad_norm = self._get_grad_norm(model, grad_norm=grad_norm)
        self.control = handler.on_pre_optimizer_step(args, self.state, self.control)
        self.optimizer.step()
        self.control = handler.on_optimizer_step(args, self.state, self.control)
        learning_rate = self._get_learning_rate()  # the rate this step used, before the schedule moves on
        if not self.accelerator.optimizer_step_was_skipped and not self._scheduler_needs_metrics():
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, learning_rate

    def _clip_grad_norm(self, model: nn.Module) -> torch.Tensor:
        """Clip the gradients to ``max_grad_norm``; return their norm before clipping."""
        return self.accelerator.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)

    def _get_grad_norm(self, model: nn.Module, grad_norm: torch.Tensor | float | None = None) -> torch.Tensor | float:
        """The gradients' norm: ``grad_norm`` when clipping measured it, else measured now (without clipping)."""
        if grad_norm is None:
            grad_norm = self.accelerator.clip_grad_norm_(model.parameters(), float("inf"))
        return grad_norm

    def _scheduler_needs_metrics(self) -> bool:
        return isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None, model: nn.Module,
                                 trial: Any, epoch: float, ignore_keys_for_eval: list[str] | None, start_time: float,
                                 learning_rate: float | None = None) -> None:
        """Log, evaluate and save as the control asks. ``tr_loss`` is the running loss since the last log (on the
        device, summed over processes when logged)."""
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            values = self.meter.flush()
            self._globalstep_last_logged = self.state.global_step
            self._count_input_tokens(values)
            self.store_flos()
            rate = learning_rate if learning_rate is not None else self._get_learning_rate()
            add_to_next_tracker_log(self.callback_handler, throughput_logs(values))  # trackers only, not log_history
            self.log(training_logs(values, grad_norm, rate), start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = self._determine_best_metric(metrics=metrics, trial=trial)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _count_input_tokens(self, values: Mapping[str, float]) -> None:
        if values and self.args.include_num_input_tokens_seen != "no":
            self.state.num_input_tokens_seen += int(values["tokens"])

    def _finalize_training(self, trial: Any, num_train_samples: float, start_time: float) -> TrainOutput:
        """The run's metrics (logged), the best model when asked, ``on_train_end``."""
        args, state = self.args, self.state
        checkpoints.finish_background_save(self)  # train() returns with its last checkpoint durable and visible
        self._count_input_tokens(self.meter.flush())  # steps since the last log still count in train_loss
        steps_run = state.global_step - self._initial_global_step
        # The share of the planned samples this call trained on (transformers' count).
        metrics = speed_metrics("train", start_time, num_samples=num_train_samples * steps_run / max(state.max_steps, 1),
                                num_steps=steps_run)
        self.store_flos()
        metrics.update(total_flos=state.total_flos, train_loss=self.meter.train_loss)
        self._memory_tracker.stop_and_update_metrics(metrics)
        self.log(metrics)
        if args.load_best_model_at_end and state.best_model_checkpoint is not None:
            self._load_best_model()
        self.control = self.callback_handler.on_train_end(args, state, self.control)
        self._finish_current_push()
        return TrainOutput(state.global_step, self.meter.train_loss, metrics)


if TYPE_CHECKING:  # mypy checks that the Trainer has all that checkpointing/ reads and writes on it
    from trainkit.engine import PreemptionWatch

    from .checkpointing.protocol import PreemptibleTrainer
    _CHECKPOINTED: type[PreemptibleTrainer] = Trainer
