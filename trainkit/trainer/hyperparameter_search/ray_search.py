"""The Ray Tune backend: ``ray.tune.run`` with the Trainer sent to each trial's worker process.

The model is left out of what is sent (``model_init`` builds each trial's own) and put back afterwards. A trial
reports its objective at every evaluation during training (and a checkpoint when one is due), else once after
training with a final evaluation; a trial Ray Tune restores resumes from its reported checkpoint.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Schedulers that stop or exploit trials from their intermediate results: they need evaluations during training.
_INTERMEDIATE_SCHEDULERS = ("ASHAScheduler", "MedianStoppingRule", "HyperBandForBOHB", "PopulationBasedTraining")


def _objective(config: dict[str, Any], local_trainer: Any) -> None:
    """One trial, in a Ray worker (a Ray Tune function trainable)."""
    import ray.tune

    from .trial import save_for_tune

    local_trainer.objective = None
    checkpoint = ray.tune.get_checkpoint()
    if checkpoint:
        local_trainer.objective = "objective"  # a restored trial that has nothing left to train reports nothing more
        with checkpoint.as_directory() as folder:
            resume = next(Path(folder).glob("checkpoint-*")).as_posix()
            local_trainer.train(resume_from_checkpoint=resume, trial=config)
    else:
        local_trainer.train(trial=config)
    if local_trainer.objective is None:  # no evaluation during training: one at the end, reported as the result
        metrics = local_trainer.evaluate()
        local_trainer.objective = local_trainer.compute_objective(metrics)
        metrics.update(objective=local_trainer.objective, done=True)
        with tempfile.TemporaryDirectory() as folder:
            save_for_tune(local_trainer, folder)
            ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(folder))


def run_ray(trainer: Any, n_trials: int, direction: str, **kwargs: Any) -> Any:
    """``ray.tune.run`` of ``n_trials`` samples of ``hp_space(None)``; the best trial by ``objective`` (scope:
    the ``RAY_SCOPE`` environment variable, default "last") as transformers' ``BestRun`` with the analysis."""
    import ray.tune
    from transformers.trainer_utils import BestRun

    if isinstance(direction, list):
        raise ValueError("hyperparameter_search(backend='ray') optimises one objective: give one direction.")
    kwargs.setdefault("resources_per_trial", {"cpu": 1, **({"gpu": 1} if trainer.args.n_gpu > 0 else {})})
    if "progress_reporter" not in kwargs:
        kwargs["progress_reporter"] = ray.tune.CLIReporter(metric_columns=["objective"])
    scheduler = kwargs.get("scheduler")
    evaluates = trainer.args.do_eval and trainer.args.eval_strategy != "no"
    if scheduler is not None and type(scheduler).__name__ in _INTERMEDIATE_SCHEDULERS and not evaluates:
        raise RuntimeError(f"{type(scheduler).__name__} decides from results reported during training, and this "
                           "Trainer does not evaluate during training: set eval_strategy='steps' or 'epoch'.")
    model, wrapped = trainer.model, trainer.model_wrapped
    trainer.model = trainer.model_wrapped = None  # each trial builds its own with model_init; not sent to workers
    try:
        analysis = ray.tune.run(ray.tune.with_parameters(_objective, local_trainer=trainer),
                                config=trainer.hp_space(None), num_samples=n_trials, **kwargs)
    finally:
        trainer.model, trainer.model_wrapped = model, wrapped
    best = analysis.get_best_trial(metric="objective", mode=direction[:3], scope=os.getenv("RAY_SCOPE", "last"))
    if best is None:
        raise RuntimeError("Ray Tune finished no trial that reported an objective.")
    return BestRun(best.trial_id, best.last_result["objective"], best.config, analysis)
