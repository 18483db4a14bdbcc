"""The search backends by name (transformers' ``HPSearchBackend`` values): Optuna and Ray Tune.

A backend is a small class: its ``name``, the package to install, ``is_available()``, its default search space
(transformers' own ``default_hp_space_*``) and ``run(trainer, n_trials, direction, **kwargs)``. With no backend
named, the first installed one is used, Optuna before Ray Tune, as transformers does.
"""

from __future__ import annotations

import importlib.util
from typing import Any


class SearchBackend:
    """One hyperparameter search library."""

    name: str
    package: str
    module: str

    @classmethod
    def is_available(cls) -> bool:
        """Whether its package is installed."""
        return importlib.util.find_spec(cls.module) is not None

    def default_hp_space(self, trial: Any) -> dict[str, Any]:
        """transformers' default search space for this backend."""
        raise NotImplementedError

    def run(self, trainer: Any, n_trials: int, direction: Any, **kwargs: Any) -> Any:
        """Run the search; return transformers' BestRun (or a list of them)."""
        raise NotImplementedError


class OptunaBackend(SearchBackend):
    """Optuna: trials in this process (and on every rank of a distributed run), pruning through the reported
    objective."""

    name, package, module = "optuna", "optuna", "optuna"

    def default_hp_space(self, trial: Any) -> dict[str, Any]:
        from transformers.trainer_utils import default_hp_space_optuna

        return default_hp_space_optuna(trial)

    def run(self, trainer: Any, n_trials: int, direction: Any, **kwargs: Any) -> Any:
        from .optuna_search import run_optuna

        return run_optuna(trainer, n_trials, direction, **kwargs)


class RayTuneBackend(SearchBackend):
    """Ray Tune: each trial in a Ray worker process, with the Trainer sent to it."""

    name, package, module = "ray", "'ray[tune]'", "ray.tune"

    @classmethod
    def is_available(cls) -> bool:
        return importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.tune") is not None

    def default_hp_space(self, trial: Any) -> dict[str, Any]:
        from transformers.trainer_utils import default_hp_space_ray

        return default_hp_space_ray(trial)

    def run(self, trainer: Any, n_trials: int, direction: Any, **kwargs: Any) -> Any:
        from .ray_search import run_ray

        return run_ray(trainer, n_trials, direction, **kwargs)


BACKENDS: dict[str, type[SearchBackend]] = {backend.name: backend for backend in (OptunaBackend, RayTuneBackend)}


def backend_named(name: Any) -> SearchBackend:
    """The backend ``name`` (a string or transformers' HPSearchBackend), or the first installed; checks it is."""
    if name is None:
        available = [backend for backend in BACKENDS.values() if backend.is_available()]
        if not available:
            raise RuntimeError("No hyperparameter search backend is installed: pip install optuna, or pip install "
                               "'ray[tune]'.")
        return available[0]()
    value = str(getattr(name, "value", name))
    if value == "wandb":
        raise ValueError("hyperparameter_search(backend='wandb'): W&B sweeps are not supported by trainkit; use "
                         "backend='optuna' or 'ray'.")
    if value not in BACKENDS:
        raise ValueError(f"hyperparameter_search(backend={value!r}): valid backends are {sorted(BACKENDS)}.")
    backend = BACKENDS[value]
    if not backend.is_available():
        raise RuntimeError(f"You picked the {value} backend, but it is not installed: pip install {backend.package}.")
    return backend()
