"""The Optuna backend: a study optimised in this process, each trial one ``trainer.train(trial=...)``.

On several processes the main process runs the study; before each trial it draws the parameters and sends them
to the other ranks as an ``optuna.trial.FixedTrial`` (the engine's object broadcast), so every rank trains with
the same arguments; they return None, the main process the ``BestRun``.
"""

from __future__ import annotations

from typing import Any


def run_optuna(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> Any:
    """``optuna.create_study(direction(s), **kwargs)`` optimised over ``n_trials`` trainings (see the module doc)."""
    import optuna
    from transformers.trainer_utils import BestRun

    if trainer.args.process_index != 0:
        for _ in range(n_trials):
            _train_trial(trainer, _received_trial())
        return None
    optimize = {name: kwargs.pop(name) for name in ("timeout", "n_jobs", "gc_after_trial", "catch") if name in kwargs}
    several = isinstance(direction, list)
    directions: Any = direction  # "minimize"/"maximize", checked by hyperparameter_search
    study = optuna.create_study(direction=None if several else directions, directions=directions if several else None,
                                **kwargs)

    def objective(trial: optuna.Trial) -> Any:
        if trainer.args.world_size > 1:
            trainer.hp_space(trial)  # draw the parameters here, then send them to the other ranks
            _send_trial(optuna.trial.FixedTrial(trial.params, trial.number))
        return _train_trial(trainer, trial)

    study.optimize(objective, n_trials=n_trials, **optimize)
    if several:
        return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]
    best = study.best_trial
    return BestRun(str(best.number), best.value if best.value is not None else float("nan"), best.params)


def _train_trial(trainer: Any, trial: Any) -> Any:
    """One trial: train, evaluate at the end when training did not, release the trial's prepared objects."""
    trainer.objective = None
    trainer.train(resume_from_checkpoint=None, trial=trial)
    if trainer.objective is None:  # no evaluation during training
        trainer.objective = trainer.compute_objective(trainer.evaluate())
    trainer.accelerator.free_memory()
    return trainer.objective


def _send_trial(trial: Any) -> None:
    from trainkit.engine import broadcast_object_list

    broadcast_object_list([trial], from_process=0)


def _received_trial() -> Any:
    from trainkit.engine import broadcast_object_list

    return broadcast_object_list([None], from_process=0)[0]
