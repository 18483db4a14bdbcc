"""A tiny regression search run by transformers' or trainkit's Trainer (imported by the tests and run as a script
for Ray Tune, whose workers import it by path).

The seeded samplers (Optuna's TPE, Ray Tune's basic variant generator) propose the same parameters to both; the
runs are deterministic (no dropout, seeded), so each trial's objective is the same too.
"""

from __future__ import annotations

import importlib
import json
import sys

import torch
from torch import nn


class Data(torch.utils.data.Dataset):
    """y = x . w + noise, 4 features."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(size, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Regressor(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def model_init(trial):
    """The hidden size comes from the trial (Optuna draws it here; Ray Tune's config carries it)."""
    if trial is None:
        return Regressor()
    if hasattr(trial, "suggest_categorical"):
        return Regressor(trial.suggest_categorical("hidden", [4, 8, 16]))
    return Regressor(trial["hidden"])


def trainer(lib, output_dir: str, **overrides):
    settings = dict(num_train_epochs=3, per_device_train_batch_size=8, learning_rate=1e-2, eval_strategy="epoch",
                    save_strategy="epoch", seed=3, report_to="none", use_cpu=True, disable_tqdm=True,
                    logging_strategy="epoch", lr_scheduler_type="constant", optim="adamw_torch")
    settings.update(overrides)
    args = lib.TrainingArguments(output_dir, **settings)
    return lib.Trainer(model_init=model_init, args=args, train_dataset=Data(64, 0), eval_dataset=Data(32, 1))


def optuna_space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True),
            "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16])}


def run_optuna(lib, output_dir: str, n_trials: int = 6, **search):
    """Trials of an Optuna search (number, state, params, values) and its BestRun; a median pruner stops the
    trials whose first evaluations are worse than the median."""
    import optuna

    study = {}

    class Recorder(optuna.samplers.TPESampler):  # keeps the study, to read every trial back
        def before_trial(self, s, trial):
            study["study"] = s
            return super().before_trial(s, trial)

    best = trainer(lib, output_dir).hyperparameter_search(
        hp_space=optuna_space, n_trials=n_trials, backend="optuna",
        sampler=Recorder(seed=0, n_startup_trials=3), pruner=optuna.pruners.MedianPruner(n_startup_trials=2), **search)
    trials = [(t.number, t.state.name, t.params, t.values) for t in study["study"].trials]
    return trials, best


def ray_space(trial):
    from ray import tune

    return {"learning_rate": tune.loguniform(1e-3, 1e-1), "per_device_train_batch_size": tune.choice([4, 8, 16]),
            "hidden": tune.choice([4, 8, 16])}


def run_ray(lib_name: str, output_dir: str) -> dict:
    """A Ray Tune search of 4 trials (seeded variant generator, one CPU each): every trial's config and objective."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    lib = importlib.import_module(lib_name)
    best = trainer(lib, output_dir).hyperparameter_search(
        hp_space=ray_space, n_trials=4, backend="ray", search_alg=BasicVariantGenerator(random_state=0), verbose=0,
        storage_path=f"{output_dir}/ray_results", name="search", resources_per_trial={"cpu": 1})
    trials = sorted(([t.config, t.last_result["objective"]] for t in best.run_summary.trials), key=json.dumps)
    return {"best": [best.objective, best.hyperparameters], "trials": trials}


if __name__ == "__main__":  # python search_task.py OUTPUT_DIR RESULT_JSON: the Ray Tune search of both Trainers
    results = {lib: run_ray(lib, f"{sys.argv[1]}/{lib}") for lib in ("transformers", "trainkit")}  # one Ray start
    with open(sys.argv[2], "w") as handle:
        json.dump(results, handle)
