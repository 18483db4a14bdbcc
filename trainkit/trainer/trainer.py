"""The Trainer: transformers' Trainer API over trainkit's engine, with a training loop that fits on one screen.

Everything a user may change is a small method (compute_loss, training_step, prediction_step, create_optimizer,
create_scheduler, get_*_dataloader, log, evaluate). Accumulation is the engine's: the Trainer opens each window
of micro-batches in the engine (which counts its loss items on every process and decides when gradients sync)
and keeps only its weighting policy (trainer/loss_items.py): a loss divided by ``num_items_in_batch`` as transformers
counts it is the window's share already, a micro-batch's own mean is weighted by its share of the window's items.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from . import hub, hyperparameter_search as hp_search, loss_items, optim, wiring
from .arguments import TrainingArguments
from .callbacks import (CallbackHandler, DefaultFlowCallback, PrinterCallback, ProgressCallback, TrackerCallback,
                        TrainerControl, TrainerState, add_to_next_tracker_log)
from .checkpointing import files as checkpoints, preemption, resume
from .checkpointing.manager import CheckpointManager
from .construction_checks import check_trainer_inputs
from .data import (ItemCounter, call_model, default_collator, default_label_names, loss_from_outputs,
                   remove_unused_columns, samples_in, split_loss, tokens_in, unprepared_loader)
from .evaluation import EvalLoopOutput, PredictionOutput, evaluation_loop as run_evaluation_loop, speed_metrics
from .neftune import neftune_while_training
from .meter import (TrainingMeter, current_learning_rate, flops_parameters, log_metrics_block, throughput_logs,
                    training_logs, write_metrics_file)
from .deepspeed import scheduler_from_config
from .optim import build_scheduler
from .sampling import SamplingHooks
from .plan import TrainingPlan, length_or_none, loader_epoch, log_plan, training_plan, window_sizes

logger = logging.getLogger(__name__)


class TrainOutput(NamedTuple):
    """What ``Trainer.train`` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class Trainer(SamplingHooks, hp_search.HyperparameterSearchMethods):
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
        # Datasets and functions against the strategies: fail now, before a model is built, not after an epoch.
        check_trainer_inputs(type(self), self.args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             compute_metrics=compute_metrics, data_collator=data_collator)
        wiring.seed_run(self.args)  # before model_init, so its initial weights are reproducible
        self._deepspeed: Any = None  # the translated TrainingArguments(deepspeed=...), when given
        self.is_in_train = False
        self._memory_tracker = wiring.memory_tracker(self.args)
        self._memory_tracker.start()  # named by its caller (__init__, train, evaluate): transformers' stages
        self._loaded_model = model  # read by create_accelerator: a model transformers sharded sets the layout
        self.accelerator = self.create_accelerator()
        wiring.apply_log_level(self.args)
        self.hub = None
        if self.args.push_to_hub:
            from .hub import HubUploader

            self.hub = HubUploader(self.args)  # fails here, before any training, when the Hub is unreachable
        self.model_init = model_init
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model or a model_init function.")
            model = self.call_model_init()
        self.model = self.model_wrapped = model
        self._model_prepared = False
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else default_collator(processing_class)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._train_batch_size = self.args.per_device_train_batch_size  # or what auto_find_batch_size found
        self.label_names = self.args.label_names or default_label_names(model)
        self.label_smoother = wiring.label_smoother(self.args, model)
        self.main_input_name = getattr(model, "main_input_name", "input_ids")
        self._count_items = ItemCounter(model, self.label_names)
        loss_items.set_policy(self, model)  # model_accepts_loss_kwargs & co., as transformers decides them
        self._num_parameters = flops_parameters(model)
        self._eval_dataloaders: dict[Any, DataLoader] = {}
        self._last_grad_norm: torch.Tensor | None = None
        self._step_learning_rate: float | None = None  # the rate the last optimizer step used (logged as transformers does)
        self._preemption_watch: PreemptionWatch | None = None  # while train() runs (checkpointing/preemption.py)
        self.checkpoint_manager = CheckpointManager(self)
        """Saves, resume point, rotation and the best model: every checkpoint goes through it."""
        default_callbacks = [DefaultFlowCallback, PrinterCallback if self.args.disable_tqdm else ProgressCallback]
        self.callback_handler = CallbackHandler(default_callbacks + list(callbacks or []), self.model,
                                                processing_class, self.optimizer, self.lr_scheduler)
        self.callback_handler.engine_callbacks.append(TrackerCallback(self.accelerator))
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        self.control = TrainerControl()
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        self._memory_tracker.stop_and_update_metrics()

    # ------------------------------------------------------------------ engine and process identity

    def create_accelerator(self):
        """The engine, configured from the arguments; the run's settings are then ``accelerator.config`` (the
        arguments are never written to: see trainer/engine_settings.py)."""
        from .engine_settings import accelerator_for_trainer

        if self.args.deepspeed is not None:
            from .deepspeed import deepspeed_for_trainer

            self._deepspeed = deepspeed_for_trainer(self.args)
        return accelerator_for_trainer(self.args, self._deepspeed.plugin if self._deepspeed else None,
                                       model=getattr(self, "_loaded_model", None))

    @property
    def _accumulation_steps(self) -> int:
        """Micro-batches per optimizer step, as the engine resolved it (the arguments > the launcher > 1)."""
        return self.accelerator.config.gradient_accumulation_steps

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

    # ------------------------------------------------------------------ data

    def _prepare_dataset(self, dataset: Any, description: str) -> Any:
        if self.args.remove_unused_columns:
            dataset = remove_unused_columns(dataset, self.model, self.label_names, description)
        return dataset

    def _dataloader(self, dataset: Any, batch_size: int, shuffle: bool, drop_last: bool, sampler: Any = None,
                    description: str = "data") -> DataLoader:
        loader = unprepared_loader(self, dataset, batch_size, shuffle, drop_last, sampler, description)
        return self.accelerator.prepare(loader)

    def get_train_dataloader(self) -> DataLoader:
        """The training DataLoader, shuffled with ``data_seed`` and sharded across processes by the engine."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset.")
        dataset = self._prepare_dataset(self.train_dataset, "training")
        return self._dataloader(dataset, self._train_batch_size, True, self.args.dataloader_drop_last,
                                sampler=self._get_train_sampler(dataset), description="training")

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """The evaluation DataLoader (in order, nothing dropped) of a dataset, of a dict eval_dataset's set by name,
        or of the Trainer's; built afresh on each call (as transformers) unless dataloader_persistent_workers."""
        dataset = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else eval_dataset
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("Evaluation needs an eval_dataset (in the Trainer or as an argument).")
        key = id(dataset)
        if key in self._eval_dataloaders and self.args.dataloader_persistent_workers:
            return self._eval_dataloaders[key]
        prepared = self._prepare_dataset(dataset, "evaluation")
        loader = self._dataloader(prepared, self.args.per_device_eval_batch_size, False, False,
                                  sampler=self._get_eval_sampler(prepared), description="evaluation")
        if self.args.dataloader_persistent_workers:
            self._eval_dataloaders[key] = loader
        return loader

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
        """The prediction DataLoader for ``test_dataset`` (in order, nothing dropped)."""
        dataset = self._prepare_dataset(test_dataset, "prediction")
        return self._dataloader(dataset, self.args.per_device_eval_batch_size, False, False,
                                sampler=self._get_eval_sampler(dataset), description="prediction")

    # ------------------------------------------------------------------ optimizer and schedule

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
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Both of the above (the order transformers uses)."""
        self.create_optimizer()
        self.create_scheduler(num_training_steps, self.optimizer)

    def _prepare_model(self) -> None:
        if self._model_prepared:
            return
        wiring.prepare_model_features(self, self.model)
        wrapped = self.accelerator.prepare(self.model)  # compiles in place when torch_compile is set
        self.model_wrapped = wrapped
        self.model = self.accelerator.unwrap_model(wrapped)
        self.callback_handler.model = self.model
        self._model_prepared = True

    def _setup_training(self, max_steps: int) -> None:
        # Model first: under FSDP the optimizer must be built over the sharded parameters.
        self._prepare_model()
        if getattr(self, "_optimizer_prepared", False):
            wiring.replan_schedule(self, max_steps)  # a new plan (auto_find_batch_size, a second train()) re-spans it
            return
        self._scheduler_built = self.lr_scheduler is None
        self.create_optimizer_and_scheduler(max_steps)
        self.optimizer = self.accelerator.prepare(self.optimizer)
        # The schedule counts optimizer steps itself (stepped by the loop), so it is checkpointed, not prepared.
        self.accelerator.register_for_checkpointing(self.lr_scheduler)
        self.callback_handler.optimizer, self.callback_handler.lr_scheduler = self.optimizer, self.lr_scheduler
        self._optimizer_prepared = True

    # ------------------------------------------------------------------ training

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
        """Train for ``max_steps`` or ``num_train_epochs``; resume from a checkpoint folder, or the latest with True
        (and, after a torchelastic restart, from the latest by itself unless told False)."""
        hp_search.start_trial(self, trial)  # a trial's fresh model, arguments and engine (hyperparameter_search)
        resume_from_checkpoint = self.checkpoint_manager.resume_folder(resume_from_checkpoint)
        wiring.batch_size_to_resume(self, resume_from_checkpoint)
        run = functools.partial(self._train_once, resume_from_checkpoint, ignore_keys_for_eval)
        self.is_in_train = True
        self._memory_tracker.start()
        try:
            with neftune_while_training(self.model, self.args.neftune_noise_alpha):
                output = wiring.train_with_batch_size_search(self, run) if self.args.auto_find_batch_size else run()
            self._memory_tracker.stop_and_update_metrics(output.metrics)
            return output
        finally:
            self.is_in_train = False

    def _train_once(self, resume_from_checkpoint: str | None, ignore_keys_for_eval: list[str] | None) -> TrainOutput:
        train_dataloader = self.get_train_dataloader()
        if resume_from_checkpoint:  # another world size: the same global batch, before the run's length is planned
            resume.keep_global_batch_on_resume(self, resume_from_checkpoint, train_dataloader)
        plan = training_plan(train_dataloader, self._accumulation_steps,
                             self.args.max_steps, self.args.num_train_epochs)
        self._setup_training(plan.max_steps)
        log_plan(self, plan, train_dataloader)
        self.state = TrainerState(max_steps=plan.max_steps, num_train_epochs=plan.num_epochs,
                                  train_batch_size=self._train_batch_size,
                                  is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        self.state.compute_steps(self.args, plan.max_steps)
        hp_search.describe_trial(self)
        start_at = self._resume(resume_from_checkpoint, train_dataloader, plan) if resume_from_checkpoint else resume.START
        with preemption.watching(self):  # SIGTERM & co.: every rank saves one checkpoint, exits 75
            return self._training_loop(train_dataloader, plan, start_at, ignore_keys_for_eval)

    def _training_loop(self, train_dataloader, plan: TrainingPlan, start_at: resume.ResumePoint, ignore_keys_for_eval) -> TrainOutput:
        args, state, handler, model = self.args, self.state, self.callback_handler, self.model_wrapped
        handler.train_dataloader = train_dataloader
        self.meter = TrainingMeter(self.accelerator, self._num_parameters)
        model.train()  # once: evaluation switches back itself, so no step pays for it
        self.control._new_training()
        self.control = handler.on_train_begin(args, state, self.control)
        if args.eval_on_start:
            self._evaluate_during_training(ignore_keys_for_eval)
        start, start_step = time.perf_counter(), state.global_step
        self._train_start, self._initial_num_input_tokens_seen = start, state.num_input_tokens_seen
        first_epoch = state.global_step // plan.steps_per_epoch if plan.steps_per_epoch else loader_epoch(train_dataloader)
        for epoch in range(first_epoch, plan.num_epochs):
            steps_in_epoch = start_at.steps_done_in_epoch if epoch == first_epoch else 0
            batches = self._epoch_batches(train_dataloader, epoch, start_at.batches_to_skip if epoch == first_epoch else 0)
            self.control._new_epoch()
            self.control = handler.on_epoch_begin(args, state, self.control)
            pending = start_at.restore_random_states if epoch == first_epoch else None  # a transformers checkpoint's
            if pending is not None and not start_at.batches_to_skip:
                pending = pending()  # restored where transformers restores them: here, or after the first window
            epoch_iterator = iter(batches)
            for num_batches in window_sizes(train_dataloader, self._accumulation_steps, plan, steps_in_epoch):
                window, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches, args.device)
                if not window:
                    break
                if pending is not None:
                    pending = pending()
                self.control._new_step()
                self.control = handler.on_step_begin(args, state, self.control)
                self._train_window(model, window, num_items_in_batch)
                self._optimizer_step(model)
                steps_in_epoch += 1
                state.global_step += 1
                wiring.maybe_empty_cache(args, state.global_step, self.accelerator.device)
                state.epoch = epoch + (steps_in_epoch / plan.steps_per_epoch if plan.steps_per_epoch else 0)
                self.control = handler.on_step_end(args, state, self.control)
                self._maybe_log_save_evaluate(ignore_keys_for_eval)
                preemption.at_step_boundary(self)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break
            self.control = handler.on_epoch_end(args, state, self.control)
            self._maybe_log_save_evaluate(ignore_keys_for_eval)
            if self.control.should_training_stop:
                break
        return self._finish_training(start, state.global_step - start_step)

    def _epoch_batches(self, train_dataloader, epoch: int, skip_batches: int) -> Iterable[Any]:
        if hasattr(train_dataloader, "set_epoch"):
            train_dataloader.set_epoch(epoch)
        if skip_batches:
            return self.accelerator.skip_first_batches(train_dataloader, skip_batches)
        return train_dataloader

    def _train_window(self, model: nn.Module, window: list[Any], num_items_in_batch: torch.Tensor | None = None) -> None:
        """Forward and backward every micro-batch of one window; gradients are exchanged after the last only."""
        accelerator = self.accelerator
        self.current_gradient_accumulation_steps = len(window)
        self._window_loss_is_share = loss_items.open_window(self, window, num_items_in_batch)
        token_mode = self.args.include_num_input_tokens_seen
        window_loss = None
        for index, inputs in enumerate(window):
            with accelerator.accumulate(model):
                step_loss = self.training_step(model, inputs, num_items_in_batch)
            window_loss = step_loss if window_loss is None else window_loss + step_loss
            self.meter.add_micro_batch(samples_in(inputs), tokens_in(inputs, self.main_input_name, token_mode == "non_padding"))
            if index < len(window) - 1:
                self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
        self.meter.add_step(window_loss, self.args.logging_nan_inf_filter)

    def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """Forward and backward one micro-batch; return its (detached) share of the window's mean loss.

        A loss the model (or ``compute_loss_func``) divided by ``num_items_in_batch`` is already its share, as in
        transformers; a micro-batch's own mean is weighted by its share of the window's items on all processes
        (see trainer/loss_items.py). The engine's ``backward`` turns that share into gradients of the window's
        loss, whatever the strategy's reduction.
        """
        if callable(getattr(self.optimizer, "train", None)):  # schedule-free optimizers: train mode (as transformers)
            self.optimizer.train()
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
            loss, outputs = wiring.label_smoothed_loss(self, model, inputs, num_items_in_batch, passed)
        else:
            outputs = call_model(model, inputs, **passed)
            loss = loss_from_outputs(outputs)
        return (loss, outputs) if return_outputs else loss

    def _optimizer_step(self, model: nn.Module) -> None:
        args, handler = self.args, self.callback_handler
        if args.max_grad_norm and args.max_grad_norm > 0:
            self._last_grad_norm = self.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        self.control = handler.on_pre_optimizer_step(args, self.state, self.control)
        self.optimizer.step()
        self.control = handler.on_optimizer_step(args, self.state, self.control)
        self._step_learning_rate = current_learning_rate(self.lr_scheduler, self.optimizer)  # before the schedule moves on
        if not self.accelerator.optimizer_step_was_skipped and not self._scheduler_needs_metrics():
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _scheduler_needs_metrics(self) -> bool:
        return isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def _maybe_log_save_evaluate(self, ignore_keys_for_eval) -> None:
        if self.control.should_log:
            self.control.should_log = False
            self._log_training_progress()
        if self.control.should_evaluate:
            self.control.should_evaluate = False
            self._evaluate_during_training(ignore_keys_for_eval)
        if self.control.should_save:
            self.control.should_save = False
            self._save_checkpoint()
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _log_training_progress(self) -> None:
        values = self.meter.flush()
        if values:
            self._count_tokens(values["tokens"])
            rate = self._step_learning_rate
            if rate is None:
                rate = current_learning_rate(self.lr_scheduler, self.optimizer)
            add_to_next_tracker_log(self.callback_handler, throughput_logs(values))
            self.log(training_logs(values, self._last_grad_norm, rate), self._train_start)

    def _count_tokens(self, tokens: float) -> None:
        self.state.total_flos += 6.0 * self._num_parameters * tokens
        if self.args.include_num_input_tokens_seen != "no":
            self.state.num_input_tokens_seen += int(tokens)

    def _finish_training(self, start: float, steps_run: int) -> TrainOutput:
        args, state = self.args, self.state
        checkpoints.finish_background_save(self)  # train() returns with its last checkpoint durable and visible
        leftover = self.meter.flush()  # steps since the last log still count in train_loss
        if leftover:
            self._count_tokens(leftover["tokens"])
        if args.load_best_model_at_end:
            self.checkpoint_manager.load_best_model()
        data_parallel = self.accelerator.strategy.data_parallel_size  # a tensor-parallel group reads one batch
        global_batch = self._train_batch_size * self._accumulation_steps * data_parallel
        metrics = speed_metrics("train", start, num_samples=steps_run * global_batch, num_steps=steps_run)
        metrics.update(total_flos=state.total_flos, train_loss=self.meter.train_loss)
        self.log(metrics)
        self.control = self.callback_handler.on_train_end(args, state, self.control)
        return TrainOutput(state.global_step, self.meter.train_loss, metrics)

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self) -> None:
        self.checkpoint_manager.save()

    def _resume(self, folder: str, train_dataloader, plan: TrainingPlan) -> resume.ResumePoint:
        """Load ``folder``; return where the loop picks up in the current epoch."""
        return self.checkpoint_manager.resume(folder, train_dataloader, plan.steps_per_epoch)

    # ------------------------------------------------------------------ evaluation and prediction

    def _evaluate_during_training(self, ignore_keys_for_eval) -> dict[str, float]:
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        self._report_to_hp_search(self._trial, self.state.global_step, metrics)  # may prune the trial
        name = self.args.metric_for_best_model
        if name is not None:
            key = name if name.startswith("eval_") else f"eval_{name}"
            if key not in metrics:
                raise KeyError(f"metric_for_best_model={name!r}: no {key!r} among the evaluation metrics {sorted(metrics)}.")
            value, best = metrics[key], self.state.best_metric
            if best is None or (value > best if self.args.greater_is_better else value < best):
                self.state.best_metric, self.state.best_global_step = value, self.state.global_step
                if self.args.save_strategy == "best":
                    self.control.should_save = True
            if self._scheduler_needs_metrics():
                self.lr_scheduler.step(value)
        self.model_wrapped.train()
        return metrics

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Loss and ``compute_metrics`` over the evaluation set(s), gathered exactly; keys start with ``eval_``."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, Mapping):
            metrics: dict[str, float] = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start()
        self._prepare_model()
        wiring.cast_for_full_eval(self)
        dataloader = self.get_eval_dataloader(dataset)
        start = time.perf_counter()
        output = self.evaluation_loop(dataloader, "Evaluation", True if self.compute_metrics is None else None,
                                      ignore_keys, metric_key_prefix)
        metrics = dict(output.metrics)
        metrics.update(speed_metrics(metric_key_prefix, start, output.num_samples, length_or_none(dataloader)))
        self._memory_tracker.stop_and_update_metrics(metrics)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        if not self.is_in_train:
            self._close_trackers()
        return metrics

    def evaluation_loop(self, dataloader: DataLoader, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Predictions, labels, loss and ``compute_metrics`` over ``dataloader`` (from ``get_eval_dataloader`` or
        ``get_test_dataloader``), gathered exactly. ``evaluate``/``predict`` go through it; subclasses such as
        the example scripts' ``QuestionAnsweringTrainer`` call it directly, so it prepares the model itself."""
        self._prepare_model()
        wiring.cast_for_full_eval(self)
        return run_evaluation_loop(self, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)

    def _close_trackers(self) -> None:
        """After an evaluate() outside train(): its log restarted the trackers; close them (no file left open)."""
        for callback in self.callback_handler.engine_callbacks:
            if isinstance(callback, TrackerCallback) and callback.started:
                callback.on_train_end(self.args, self.state, self.control)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions, label ids (when the data has labels) and metrics, one row per sample in dataset order."""
        self._memory_tracker.start()  # here, in predict(): the tracker names its metrics after the calling method
        self._prepare_model()
        wiring.cast_for_full_eval(self)
        dataloader = self.get_test_dataloader(test_dataset)
        start = time.perf_counter()
        output = self.evaluation_loop(dataloader, "Prediction", None, ignore_keys, metric_key_prefix)
        metrics = dict(output.metrics)
        metrics.update(speed_metrics(metric_key_prefix, start, output.num_samples, length_or_none(dataloader)))
        self._memory_tracker.stop_and_update_metrics(metrics)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, predictions, labels) of one batch, without gradients."""
        if ignore_keys is None:  # transformers' default: the model's cache output (named "cache" from 5.24 on)
            config = getattr(self.model, "config", None)
            ignore_keys = [] if config is None else list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values", "cache"]))
        is_dict = isinstance(inputs, Mapping)
        has_labels = is_dict and all(inputs.get(name) is not None for name in self.label_names)
        labels = None
        if has_labels:
            labels = tuple(inputs[name].detach() for name in self.label_names)
            labels = labels[0] if len(labels) == 1 else labels
        with torch.no_grad():
            if has_labels:
                num_items = loss_items.evaluation_items(self, inputs)  # as transformers counts them
                loss, outputs = self.compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items)
                loss = loss_items.evaluation_loss(self, loss, num_items)
                _, predictions = split_loss(outputs, ignore_keys)
            else:
                loss, predictions = split_loss(call_model(model, inputs), ignore_keys)
        loss = loss.detach().mean() if loss is not None else None
        if prediction_loss_only:
            return loss, None, None
        return loss, predictions, labels

    # ------------------------------------------------------------------ logging and saving

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record ``logs`` (with epoch and step) in ``state.log_history`` and send them to the callbacks and trackers.

        ``epoch`` (and the token count) are added to ``logs`` itself, as transformers does: the metrics that
        ``train()`` and ``evaluate()`` return, and scripts save with ``save_metrics``, carry the epoch. With
        ``include_num_input_tokens_seen``, ``start_time`` (the run's ``time.perf_counter()``) adds its token rate."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":  # with this run's token rate, as transformers
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                tokens = self.state.num_input_tokens_seen - getattr(self, "_initial_num_input_tokens_seen", 0)
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs=logs)

    def save_model(self, output_dir: str | None = None) -> None:
        """Write the full weights (safetensors), config and tokenizer to ``output_dir`` (default: args.output_dir)."""
        self._prepare_model()
        output_dir = output_dir or self.args.output_dir
        if self.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
        checkpoints.save_model_files(self, output_dir)
        self.accelerator.wait_for_everyone()

    def save_state(self) -> None:
        """Write ``trainer_state.json`` to ``output_dir`` (main process)."""
        if self.is_world_process_zero():
            os.makedirs(self.args.output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(self.args.output_dir, checkpoints.TRAINER_STATE_NAME))

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Log ``metrics`` of ``split`` in a readable block (main process)."""
        if self.is_world_process_zero():
            log_metrics_block(split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write ``{split}_results.json`` (and merge into ``all_results.json`` if ``combined``) in output_dir."""
        if self.is_world_process_zero():
            write_metrics_file(self.args.output_dir, split, metrics, combined=combined)

    def create_model_card(self, **card_fields: Any) -> None:
        """Write a draft model card (README.md) to ``output_dir``; keywords as transformers' (main process)."""
        if self.is_world_process_zero():
            hub.write_model_card(self, **card_fields)

    def push_to_hub(self, commit_message: str = "End of training", **card_fields: Any) -> None:
        """Save the model and a model card (``card_fields`` as create_model_card's) to ``output_dir`` and upload them
        (needs push_to_hub=True, checked at construction)."""
        if self.hub is None:
            raise ValueError("push_to_hub() needs TrainingArguments(push_to_hub=True), which checks the Hub when the Trainer is created.")
        self.save_model()
        self.create_model_card(**card_fields)
        if self.is_world_process_zero():
            self.hub.upload(self.args.output_dir, commit_message)


if TYPE_CHECKING:  # mypy checks that the Trainer has all that checkpointing/ reads and writes on it
    from trainkit.engine.process.preemption import PreemptionWatch

    from .checkpointing.protocol import PreemptibleTrainer
    _CHECKPOINTED: type[PreemptibleTrainer] = Trainer
