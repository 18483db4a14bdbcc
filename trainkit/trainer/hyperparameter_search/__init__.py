"""``Trainer.hyperparameter_search``: transformers' search over Optuna or Ray Tune, with trainkit's Trainer.

:mod:`.trial` holds what one trial does inside ``train()`` (a fresh model from ``model_init``, the trial's
arguments, its ``run-{id}`` checkpoint folder, reporting for pruning); :mod:`.backends` the registry of search
backends, one module each (:mod:`.optuna_search`, :mod:`.ray_search`). Results are transformers' ``BestRun``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .backends import backend_named
from .trial import (call_model_init, hp_search_setup, report_to_hp_search, run_output_dir,
                    save_for_tune, start_trial)


def hyperparameter_search(trainer: Any, hp_space: Callable[[Any], dict[str, Any]] | None = None,
                          compute_objective: Callable[[dict[str, float]], float] | None = None, n_trials: int = 20,
                          direction: str | list[str] = "minimize", backend: Any = None,
                          hp_name: Callable[[Any], str] | None = None, **kwargs: Any) -> Any:
    """Run ``n_trials`` trainings of ``trainer`` (each from a fresh ``model_init`` model, with the arguments
    ``hp_space`` draws) and return the best as transformers' ``BestRun`` (a list of them for several
    ``direction``s). ``kwargs`` go to the backend: ``optuna.create_study`` (and ``timeout``, ``n_jobs``,
    ``gc_after_trial``, ``catch`` of ``study.optimize``), or ``ray.tune.run``."""
    from transformers.trainer_utils import HPSearchBackend, default_compute_objective

    search = backend_named(backend)
    if trainer.model_init is None:
        raise RuntimeError("hyperparameter_search needs the Trainer built with model_init=...: each trial trains a "
                           "fresh model.")
    _check_directions(direction)
    trainer.hp_search_backend = HPSearchBackend(search.name)
    trainer.hp_space = search.default_hp_space if hp_space is None else hp_space
    trainer.hp_name = hp_name
    trainer.compute_objective = default_compute_objective if compute_objective is None else compute_objective
    try:
        return search.run(trainer, n_trials, direction, **kwargs)
    finally:
        trainer.hp_search_backend = None


class HyperparameterSearchMethods:
    """The Trainer's hyperparameter-search methods and hooks, transformers' names and signatures (mixed into
    :class:`~trainkit.Trainer`; the work is in this package's functions)."""

    hp_search_backend: Any = None
    """transformers' HPSearchBackend while ``hyperparameter_search`` runs, else None."""
    hp_name: Callable[[Any], str] | None = None
    """Names a trial's run folder (``hyperparameter_search(hp_name=...)``); None: ``run-{trial id}``."""
    _trial: Any = None

    def hyperparameter_search(self, hp_space: Callable[[Any], dict[str, Any]] | None = None,
                              compute_objective: Callable[[dict[str, float]], float] | None = None,
                              n_trials: int = 20, direction: str | list[str] = "minimize", backend: Any = None,
                              hp_name: Callable[[Any], str] | None = None, **kwargs: Any) -> Any:
        """Search hyperparameters with Optuna or Ray Tune, as transformers does; returns its ``BestRun`` (a list
        for several directions). Needs ``model_init``; see docs/trainer.md."""
        return hyperparameter_search(self, hp_space, compute_objective, n_trials, direction, backend, hp_name,
                                     **kwargs)

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """A fresh model from ``model_init()``, or ``model_init(trial)`` when it takes one argument."""
        return call_model_init(self, trial)

    def _hp_search_setup(self, trial: Any) -> None:
        hp_search_setup(self, trial)

    def _get_output_dir(self, trial: Any) -> str:
        return run_output_dir(self, trial)

    def _report_to_hp_search(self, trial: Any, step: int, metrics: dict[str, float]) -> None:
        report_to_hp_search(self, trial, step, metrics)

    def _tune_save_checkpoint(self, checkpoint_dir: str) -> None:
        save_for_tune(self, checkpoint_dir)


def _check_directions(direction: str | list[str]) -> None:
    for value in direction if isinstance(direction, list) else [direction]:
        if value not in ("minimize", "maximize"):
            raise ValueError(f"hyperparameter_search(direction={direction!r}): each direction is 'minimize' or 'maximize'.")


__all__ = ["HyperparameterSearchMethods", "call_model_init", "hp_search_setup", "hyperparameter_search", "report_to_hp_search",
           "run_output_dir", "start_trial"]
