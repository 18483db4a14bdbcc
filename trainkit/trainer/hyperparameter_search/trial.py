"""One trial inside ``Trainer.train(trial=...)``, in transformers' order and with its semantics.

``start_trial`` runs first in ``train()``: with a ``model_init`` (in a search or not) the model is rebuilt by
``model_init`` after seeding (``call_model_init``: ``model_init()`` or ``model_init(trial)``), then
``hp_search_setup`` sets the trial's parameters on the arguments (cast to each field's type) and gives the Trainer
a fresh engine built from them. Checkpoints of a trial go to ``output_dir/run-{trial id}`` (``run_output_dir``),
and every evaluation during training reports the objective to the backend (``report_to_hp_search``): Optuna's
``trial.report`` and ``should_prune`` (a pruned trial raises ``optuna.TrialPruned``), Ray Tune's ``tune.report``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)


def call_model_init(trainer: Any, trial: Any = None) -> nn.Module:
    """``model_init()`` or ``model_init(trial)``, by the number of arguments it takes (transformers' rule)."""
    from transformers.trainer_utils import number_of_arguments

    count = number_of_arguments(trainer.model_init)
    if count == 0:
        model = trainer.model_init()
    elif count == 1:
        model = trainer.model_init(trial)
    else:
        raise RuntimeError(f"model_init takes {count} arguments; it should take none or one (the trial).")
    if model is None:
        raise RuntimeError("model_init returned None; it should return the model to train.")
    return model


def _backend(trainer: Any) -> str | None:
    value = getattr(trainer, "hp_search_backend", None)
    return None if value is None else str(getattr(value, "value", value))


def start_trial(trainer: Any, trial: Any) -> None:
    """``train()``'s first step: with a ``model_init``, a fresh seeded model (and optimizer, schedule and engine) at
    every ``train()``, as transformers does, so training again starts from scratch and whatever a script drew
    before (an evaluation's data order) does not change the run; then a trial's arguments and engine."""
    if trainer.model_init is not None:
        from trainkit.trainer.sampling import seed_run

        seed_run(trainer.args)  # the seed comes before the model, so each run (each trial) starts from the same draw
        trainer.model = trainer.model_wrapped = trainer.callback_handler.model = trainer.call_model_init(trial)
        trainer.optimizer = trainer.lr_scheduler = None
        if trainer._model_prepared:  # the engine holds the previous model: a new one (else the user's is kept)
            _fresh_engine(trainer)
    trainer._hp_search_setup(trial)


def hp_search_setup(trainer: Any, trial: Any) -> None:
    """Set the trial's parameters on ``trainer.args`` (each cast to the field's current type) and rebuild the
    engine from them; remembers the trial (``trainer._trial``). Nothing to do outside a search."""
    trainer._trial = trial
    backend = _backend(trainer)
    if backend is None or trial is None:
        return
    if backend == "optuna":
        params = trainer.hp_space(trial)
    else:
        params = trial
        params.pop("wandb", None)
    for key, value in params.items():
        if not hasattr(trainer.args, key):
            logger.warning("The hyperparameter search sets %r, which is not a TrainingArguments field: ignored "
                           "(model_init can read it from the trial).", key)
            continue
        current = getattr(trainer.args, key)
        setattr(trainer.args, key, type(current)(value) if current is not None else value)
    if backend == "optuna":
        logger.info("Trial: %s", trial.params)
    trainer._train_batch_size = trainer.args.per_device_train_batch_size  # a trial may change it (as transformers)
    _fresh_engine(trainer)


def _fresh_engine(trainer: Any) -> None:
    """A new Accelerator from the (changed) arguments, with nothing prepared yet: the trial's model, optimizer
    and data loaders are prepared by it (transformers recreates its accelerator likewise)."""
    from ..callbacks import TrackerCallback

    trainer.create_accelerator_and_postprocess()
    for callback in trainer.callback_handler.engine_callbacks:
        if isinstance(callback, TrackerCallback):
            callback.accelerator, callback.started = trainer.accelerator, False
    trainer.model_wrapped = trainer.model
    trainer.callback_handler.model = trainer.model
    trainer._eval_dataloaders = {}
    trainer._model_prepared = trainer._optimizer_prepared = False


def run_output_dir(trainer: Any, trial: Any) -> str:
    """Where a run's checkpoints go: ``output_dir``, or ``output_dir/run-{trial id}`` (or ``hp_name(trial)``)
    for a trial of a search (the Optuna trial number, the Ray Tune trial id)."""
    backend = _backend(trainer)
    if backend is None or trial is None:
        return trainer.args.output_dir
    if trainer.hp_name is not None:
        name = trainer.hp_name(trial)
    elif backend == "optuna":
        name = f"run-{trial.number}"
    else:
        import ray.tune

        name = f"run-{ray.tune.get_context().get_trial_id()}"
    return os.path.join(trainer.args.output_dir, name)


def report_to_hp_search(trainer: Any, trial: Any, step: int, metrics: dict[str, float]) -> None:
    """After an evaluation during training: the objective to the backend, which may stop (prune) the trial."""
    backend = _backend(trainer)
    if backend is None or trial is None:
        return
    metrics = dict(metrics)
    trainer.objective = trainer.compute_objective(metrics)
    if backend == "optuna":
        import optuna

        if hasattr(trial, "study") and not trial.study._is_multi_objective():
            trial.report(trainer.objective, step)
            if trial.should_prune():
                trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
                raise optuna.TrialPruned()
        return
    import ray.tune

    metrics["objective"] = trainer.objective
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if trainer.control.should_save:
            save_for_tune(trainer, folder)
            checkpoint = ray.tune.Checkpoint.from_directory(folder)
        ray.tune.report(metrics, checkpoint=checkpoint)


def save_for_tune(trainer: Any, folder: str) -> None:
    """A complete trainkit checkpoint ``checkpoint-{step}`` in ``folder``, which Ray Tune keeps with the result
    (a restored trial resumes from it)."""
    from ..checkpointing.files import checkpoint_folder, save_checkpoint

    save_checkpoint(trainer, checkpoint_folder(folder, trainer.state.global_step), synchronous=True)
