"""Callbacks: the events of the training loop, the state they see, the controls they set, and the built-in ones.

The Trainer calls :class:`CallbackHandler` at each event; callbacks read :class:`TrainerState` and ask for
logging, evaluation, saving or stopping through :class:`TrainerControl`. :class:`DefaultFlowCallback` turns the
``*_strategy`` arguments into those requests, so the loop itself never reads a strategy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainkit.engine import Accelerator

    from .training_arguments.arguments import TrainingArguments

logger = logging.getLogger(__name__)

EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)

DEFAULT_TRACKER_RUN = "logs"
"""The trackers' folder under output_dir (metrics.jsonl, TensorBoard files) when TrainingArguments.run_name is None."""


@dataclasses.dataclass
class TrainerState:
    """Where training stands; saved in each checkpoint as ``trainer_state.json`` (same keys as transformers)."""

    epoch: float = 0.0
    """Epochs done, fractional inside an epoch."""
    global_step: int = 0
    """Optimizer steps done."""
    max_steps: int = 0
    """Optimizer steps the run will take."""
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    """The ``*_steps`` arguments resolved to step counts (ratios multiplied by ``max_steps``)."""
    train_batch_size: int | None = None
    """Per-process micro-batch size."""
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    """Input tokens over all processes (when ``include_num_input_tokens_seen`` is on)."""
    total_flos: float = 0.0
    """Estimated floating-point operations so far (6 x parameters x tokens; 0 when the input is not tokens)."""
    log_history: list[dict[str, float]] = None  # type: ignore[assignment]  # None -> [] (transformers' default)
    """Every dict passed to ``Trainer.log``, with epoch and step."""
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: dict[str, Any] = None  # type: ignore[assignment]  # a list of ExportableState -> their states
    """The states of the :class:`ExportableState` callbacks and of the :class:`TrainerControl` by class name (a list
    for several of one class), as transformers stores them: ``{"args": ..., "attributes": ...}`` each. Given a list
    of such objects, the state is built from them."""

    def __post_init__(self) -> None:
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):
            self.stateful_callbacks = exported_states(self.stateful_callbacks)

    def save_to_json(self, json_path: str) -> None:
        """Write the state as indented JSON."""
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        with open(json_path, "w", encoding="utf-8") as handle:
            handle.write(text)

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        """Read a state written by :meth:`save_to_json` (or by transformers); unknown keys are ignored."""
        with open(json_path, encoding="utf-8") as handle:
            data = json.load(handle)
        known = {f.name for f in dataclasses.fields(cls)}
        ignored = sorted(set(data) - known)
        if ignored:
            logger.info("trainer_state.json: ignoring keys %s", ignored)
        return cls(**{k: v for k, v in data.items() if k in known})

    def init_training_references(self, trainer: Any, max_steps: int, num_train_epochs: int, trial: Any) -> None:
        """Record the run's plan, the process's role and the hyperparameter-search trial (name and parameters)."""
        hp_name, current_trial = getattr(trainer, "hp_name", None), getattr(trainer, "_trial", None)
        if hp_name is not None and current_trial is not None:
            self.trial_name = hp_name(current_trial)
        self.trial_params = None
        if trial is not None:
            from transformers.integrations import hp_params

            self.trial_params = hp_params(trial)
        self.max_steps, self.num_train_epochs = max_steps, num_train_epochs
        self.is_local_process_zero = trainer.is_local_process_zero()
        self.is_world_process_zero = trainer.is_world_process_zero()

    def compute_steps(self, args: TrainingArguments, max_steps: int) -> None:
        """Resolve logging/eval/save step intervals; a value below 1 is a ratio of ``max_steps``."""
        for kind in ("logging", "eval", "save"):
            value = getattr(args, f"{kind}_steps")
            if value is None:
                continue
            steps = math.ceil(max_steps * value) if value < 1 else int(value)
            setattr(self, f"{kind}_steps", max(steps, 1))


class ExportableState:
    """An object whose state a checkpoint stores in ``TrainerState.stateful_callbacks`` and a resume restores
    (with ``restore_callback_states_from_checkpoint=True``): ``state()`` returns ``{"args": constructor
    keywords, "attributes": other attributes}``, :meth:`from_state` rebuilds the object from it."""

    def state(self) -> dict[str, Any]:
        """``{"args": ..., "attributes": ...}``, JSON-serialisable."""
        raise NotImplementedError(f"{type(self).__name__} is an ExportableState: it must define state().")

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Any:
        """A new instance built with ``state["args"]``, then given ``state["attributes"]``."""
        instance = cls(**state["args"])
        for name, value in state["attributes"].items():
            setattr(instance, name, value)
        return instance


def is_exportable(obj: Any) -> bool:
    """Whether ``obj`` is an :class:`ExportableState`: trainkit's, or transformers' own (a callback written for
    transformers.Trainer keeps its state under trainkit's). transformers' class is looked up only where it is
    already imported: an object of it cannot exist otherwise."""
    if isinstance(obj, ExportableState):
        return True
    upstream = sys.modules.get("transformers.trainer_callback")
    return upstream is not None and isinstance(obj, getattr(upstream, "ExportableState", ()))


def exported_states(objects: Any) -> dict[str, Any]:
    """``TrainerState.stateful_callbacks`` of ``objects``: each one's ``state()`` under its class name, a list of
    them when a class occurs more than once (transformers' JSON shape)."""
    states: dict[str, Any] = {}
    for obj in objects:
        if not is_exportable(obj):
            raise TypeError(f"stateful_callbacks holds ExportableState objects, not {type(obj).__name__}.")
        name = type(obj).__name__
        if name in states:
            previous = states[name]
            states[name] = (previous if isinstance(previous, list) else [previous]) + [obj.state()]
        else:
            states[name] = obj.state()
    return states


@dataclasses.dataclass
class TrainerControl(ExportableState):
    """Requests that callbacks set and the loop honours (and then clears); stored with each checkpoint."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict[str, Any]:
        """The flags, for saving with a checkpoint."""
        return {"args": dataclasses.asdict(self), "attributes": {}}


class TrainerCallback:
    """Base class of callbacks: override the events you need; each gets ``(args, state, control, **kwargs)``.

    ``kwargs`` carry ``model``, ``processing_class``, ``optimizer``, ``lr_scheduler``, ``train_dataloader``,
    ``eval_dataloader`` and, per event, ``metrics`` (on_evaluate, on_predict) or ``logs`` (on_log).
    Return a :class:`TrainerControl` (or None to keep the current one).
    """

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl | None:
        """At the end of ``Trainer.__init__``."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl | None:
        """Before the first training step."""

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl | None:
        """After the last training step (and after the best model was loaded)."""

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl | None:
        """At the start of an epoch."""

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl | None:
        """At the end of an epoch."""

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> TrainerControl | None:
        """Before the first micro-batch of an optimizer step."""

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> TrainerControl | None:
        """After gradients are final (clipped), before ``optimizer.step()``."""

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> TrainerControl | None:
        """After ``optimizer.step()``, before gradients are zeroed."""

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl | None:
        """After each micro-batch of an accumulation window except the last."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl | None:
        """After an optimizer step (``state.global_step`` already counts it)."""

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl | None:
        """After an evaluation; ``metrics`` holds its results."""

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   metrics, **kwargs: Any) -> TrainerControl | None:
        """After ``Trainer.predict``."""

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> TrainerControl | None:
        """After a checkpoint was written."""

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               **kwargs: Any) -> TrainerControl | None:
        """After ``Trainer.log``; ``logs`` holds the logged values."""

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> TrainerControl | None:
        """After each evaluation or prediction batch."""

    def on_push_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> TrainerControl | None:
        """Before an upload to the Hub."""


class CallbackHandler:
    """Calls every callback, in order, at each event, passing the objects of the Trainer along."""

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler) -> None:
        self.callbacks: list[TrainerCallback] = []
        self.engine_callbacks: list[TrainerCallback] = []
        """trainkit's own writers (the ``report_to`` trackers, :class:`TrackerCallback`): called
        first at every event, but not listed in ``callbacks``, which holds what transformers' list holds (the
        flow and progress callbacks and the user's)."""
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        if not any(isinstance(cb, DefaultFlowCallback) for cb in self.callbacks):
            logger.warning(
                "No DefaultFlowCallback among the Trainer's callbacks: logging, evaluation and saving will only "
                "happen when a callback asks for them."
            )

    def add_callback(self, callback) -> None:
        """Add a callback instance, or a class to instantiate without arguments."""
        callback = callback() if isinstance(callback, type) else callback
        if type(callback) in [type(c) for c in self.callbacks]:
            logger.warning(f"Adding a second {type(callback).__name__} to the callbacks.")  # the name in the message itself
        self.callbacks.append(callback)

    def pop_callback(self, callback):
        """Remove and return a callback given as an instance or a class (None when absent)."""
        for existing in self.callbacks:
            if existing is callback or (isinstance(callback, type) and type(existing) is callback):
                self.callbacks.remove(existing)
                return existing
        return None

    def remove_callback(self, callback) -> None:
        """Remove a callback given as an instance or a class."""
        self.pop_callback(callback)

    @property
    def callback_list(self) -> str:
        """The callbacks' class names, one per line."""
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    def call_event(self, event: str, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   **kwargs: Any) -> TrainerControl:
        """Run ``event`` on every callback; a callback may return a new control."""
        for callback in [*self.engine_callbacks, *self.callbacks]:
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None:
                control = result
        return control

    # One method per event, as transformers' handler has them; some clear the flag their event answers.
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_log = control.should_evaluate = control.should_save = False
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> TrainerControl:
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: Any,
                    **kwargs: Any) -> TrainerControl:
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: Any,
                   **kwargs: Any) -> TrainerControl:
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: Any,
               **kwargs: Any) -> TrainerControl:
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> TrainerControl:
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_push_begin", args, state, control, **kwargs)


class DefaultFlowCallback(TrainerCallback):
    """Turns logging/eval/save strategies into control requests, and stops at ``max_steps``."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl | None:
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if args.logging_strategy == "steps" and step % state.logging_steps == 0:
            control.should_log = True
        evaluate_now = args.eval_strategy == "steps" and step % state.eval_steps == 0 and args.eval_delay <= step
        if evaluate_now:
            control.should_evaluate = True
        if args.save_strategy == "steps" and step % state.save_steps == 0:
            control.should_save = True
        if step >= state.max_steps:
            control.should_training_stop = True
            # The last step is evaluated and saved under a step strategy even off the interval.
            if args.eval_strategy == "steps" and not evaluate_now and args.eval_delay <= step:
                control.should_evaluate = True
            if args.save_strategy == "steps":
                control.should_save = True
        return control

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl | None:
        if args.logging_strategy == "epoch":
            control.should_log = True
        if args.eval_strategy == "epoch" and args.eval_delay <= state.epoch:
            control.should_evaluate = True
        if args.save_strategy == "epoch":
            control.should_save = True
        return control


class ProgressCallback(TrainerCallback):
    """A tqdm bar for training and one for each evaluation, on the main process only."""

    def __init__(self, max_str_len: int = 100) -> None:
        self.training_bar: Any = None  # a tqdm bar while training (tqdm is imported on first use)
        self.prediction_bar: Any = None
        self.max_str_len = max_str_len
        """Logged strings longer than this are shown as a note of their length."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.training_bar = tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self.training_bar.n)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           eval_dataloader=None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or eval_dataloader is None:
            return
        if self.prediction_bar is None:
            from tqdm.auto import tqdm

            try:
                total = len(eval_dataloader)
            except TypeError:  # a stream: DataLoader.__len__ exists but raises
                total = None
            self.prediction_bar = tqdm(total=total, leave=self.training_bar is None, dynamic_ncols=True)
        self.prediction_bar.update(1)

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._close_prediction_bar()

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,  # type: ignore[override]  # transformers' signature
                   **kwargs: Any) -> None:  # (metrics arrives in kwargs)
        self._close_prediction_bar()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs=None, **kwargs: Any) -> None:
        if self.training_bar is not None and logs:
            shown = {k: self._shown(v) for k, v in logs.items() if k != "total_flos"}
            self.training_bar.write(str(shown))

    def _shown(self, value: Any) -> Any:
        if isinstance(value, str) and len(value) > self.max_str_len:
            return f"[a string of {len(value)} characters, over max_str_len={self.max_str_len}]"
        return f"{value:.4g}" if isinstance(value, float) else value

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None


class PrinterCallback(TrainerCallback):
    """Prints each log dict on the main process (used instead of the bar when tqdm is disabled)."""

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs=None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            print({k: v for k, v in logs.items() if k != "total_flos"}, flush=True)  # the callback's purpose


TENSORBOARD_DIR_ENV = "TENSORBOARD_LOGGING_DIR"
"""The environment variable transformers' TensorBoard callback takes its folder from (5.x)."""


def tensorboard_init_kwargs(args: TrainingArguments) -> dict[str, dict[str, Any]]:
    """The trackers' start keywords for the folder of the TensorBoard event files: ``logging_dir`` (transformers
    5.1's field, see :mod:`.older_fields`), else ``$TENSORBOARD_LOGGING_DIR`` (as transformers reads it), else
    none: the engine's default, ``output_dir/<run name>``."""
    folder = args.logging_dir or os.environ.get(TENSORBOARD_DIR_ENV)
    return {"tensorboard": {"log_dir": os.path.expanduser(folder)}} if folder else {}


class TrackerCallback(TrainerCallback):
    """Forwards every log to the engine's trackers (those ``report_to`` names: TensorBoard, W&B, MLflow, the JSONL log)."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.started = False
        self.extra: dict[str, float] = {}
        """Values for the trackers only, written with the next log (the Trainer's throughput: meter.THROUGHPUT_KEYS)."""

    def _start(self, args: TrainingArguments) -> None:
        if not self.started:
            # Trackers take flat scalars as hyperparameters (TensorBoard's hparams refuse lists and dicts).
            config = {k: v for k, v in args.to_dict().items() if isinstance(v, (int, float, str, bool))}
            # The engine's trackers write under project_dir (output_dir)/<run name>: without a run_name that
            # folder is "logs", never output_dir's own name again (which nested out/out/).
            self.accelerator.init_trackers(args.run_name or DEFAULT_TRACKER_RUN, config=config,
                                           init_kwargs=tensorboard_init_kwargs(args))
            self.started = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self._start(args)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs=None, **kwargs: Any) -> None:
        if logs:
            self._start(args)
            numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            numbers.update(self.extra)
            self.extra = {}
            self.accelerator.log(numbers, step=state.global_step)


def add_to_next_tracker_log(handler: CallbackHandler, values: dict[str, float]) -> None:
    """Have the trackers write ``values`` with the next log, outside ``state.log_history`` and the callbacks' logs."""
    for callback in handler.engine_callbacks:
        if isinstance(callback, TrackerCallback):
            callback.extra.update(values)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.accelerator.end_training()
        self.started = False


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stops training when ``metric_for_best_model`` has not improved for ``early_stopping_patience`` evaluations.

    An improvement must beat the best value by more than ``early_stopping_threshold``.
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0) -> None:
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        self.early_stopping_patience_counter = 0

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if args.metric_for_best_model is None or args.eval_strategy == "no":
            raise ValueError(
                "EarlyStoppingCallback needs evaluations to compare: set eval_strategy to 'steps' or 'epoch' and "
                "metric_for_best_model (or load_best_model_at_end=True, which defaults it to 'loss')."
            )
        if not args.load_best_model_at_end:
            logger.warning("EarlyStoppingCallback without load_best_model_at_end=True: the last model is kept, not the best.")

    def check_metric_value(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           metric_value: float) -> None:
        """Reset the patience counter on an improvement over ``state.best_metric``, else count one more miss."""
        best = state.best_metric
        improved = best is None or (
            (metric_value > best if args.greater_is_better else metric_value < best)
            and abs(metric_value - best) > self.early_stopping_threshold
        )
        self.early_stopping_patience_counter = 0 if improved else self.early_stopping_patience_counter + 1

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,  # type: ignore[override]  # transformers' signature
                    metrics: dict[str, float], **kwargs: Any) -> None:
        name = args.metric_for_best_model
        if name is None:  # refused at on_train_begin; an evaluate() outside training has nothing to stop
            return
        name = name if name.startswith("eval_") else f"eval_{name}"
        value = (metrics or {}).get(name)
        if value is None:
            logger.warning("Early stopping needs %r in the evaluation metrics, which lack it; not stopping.", name)
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict[str, Any]:
        """Constructor arguments and counter, for ``TrainerState.stateful_callbacks``."""
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
