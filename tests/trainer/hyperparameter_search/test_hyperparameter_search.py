"""Trainer.hyperparameter_search against transformers.Trainer's on the same tiny task and seed (CPU, one process).

Seeded samplers propose the same parameters to both; the runs being deterministic, every trial's objective, the
pruned trials and the best run are the same too.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="hyperparameter_search's Optuna backend needs optuna (the test extra)")
import transformers
from transformers.trainer_utils import BestRun

import trainkit
from tests.distributed import run_python, run_torchrun
from tests.trainer.hyperparameter_search import search_task

optuna.logging.set_verbosity(optuna.logging.WARNING)
needs_oracle = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                  reason="transformers.Trainer (the oracle) needs accelerate, absent here")


@needs_oracle
def test_optuna_search_proposes_and_scores_trials_as_transformers(tmp_path):
    theirs, their_best = search_task.run_optuna(transformers, str(tmp_path / "theirs"))
    ours, our_best = search_task.run_optuna(trainkit, str(tmp_path / "ours"))
    assert [t[:3] for t in ours] == [t[:3] for t in theirs]  # numbers, states (pruned ones too), parameters
    assert [t[3][0] for t in ours if t[3]] == pytest.approx([t[3][0] for t in theirs if t[3]], rel=1e-6)
    assert {t[1] for t in ours} == {"COMPLETE", "PRUNED"}  # the reported objectives did prune trials
    assert isinstance(our_best, BestRun)
    assert (our_best.run_id, our_best.hyperparameters) == (their_best.run_id, their_best.hyperparameters)
    assert our_best.objective == pytest.approx(their_best.objective, rel=1e-6)
    # Each trial's checkpoints in output_dir/run-{number}, as transformers writes them.
    # (A trial pruned at its first evaluation has saved nothing yet.)
    runs = sorted(name for name in os.listdir(tmp_path / "ours") if name.startswith("run-"))
    assert runs == sorted(name for name in os.listdir(tmp_path / "theirs") if name.startswith("run-"))
    assert runs == [f"run-{number}" for number, state, _, _ in ours if state == "COMPLETE"]
    for run in runs:
        folders = sorted(os.listdir(tmp_path / "ours" / run))
        assert folders == sorted(os.listdir(tmp_path / "theirs" / run)), run  # one per epoch of that trial's steps
        assert len(folders) == 3 and all(name.startswith("checkpoint-") for name in folders)


def test_several_directions_give_the_best_runs(tmp_path):
    def objectives(metrics):
        return metrics["eval_loss"], metrics["epoch"]

    _, best = search_task.run_optuna(trainkit, str(tmp_path), n_trials=3, compute_objective=objectives,
                                     direction=["minimize", "maximize"])
    assert isinstance(best, list) and best and all(isinstance(run, BestRun) for run in best)
    assert all(len(run.objective) == 2 for run in best)


@needs_oracle
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray Tune is not installed")
def test_ray_tune_search_runs_the_trials_transformers_runs(tmp_path):
    """Both searches in one other process (Ray starts its workers from there, importing this task by path)."""
    out = tmp_path / "results.json"
    run_python(search_task.__file__, str(tmp_path), str(out), timeout=500)
    results = json.loads(out.read_text())
    ours, theirs = results["trainkit"], results["transformers"]
    assert [t[0] for t in ours["trials"]] == [t[0] for t in theirs["trials"]]  # the same 4 configurations
    assert [t[1] for t in ours["trials"]] == pytest.approx([t[1] for t in theirs["trials"]], rel=1e-6)
    assert ours["best"][0] == pytest.approx(theirs["best"][0], rel=1e-6) and ours["best"][1] == theirs["best"][1]
    trial_folders = [name for name in os.listdir(tmp_path / "trainkit") if name.startswith("run-")]
    assert len(trial_folders) == 4  # run-{Ray trial id}, one per trial


@pytest.mark.multiprocess
def test_optuna_search_on_two_processes_trains_each_trial_on_both(tmp_path):
    """2 gloo processes: the main process runs the study and returns the BestRun, the other None; both trained
    every trial with the same arguments, those a one-process study proposes with the same seed."""
    run_torchrun(Path(search_task.__file__).with_name("optuna_worker.py"), str(tmp_path), timeout=400)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["best"] is not None and ranks[1]["best"] is None
    assert (ranks[0]["learning_rate"], ranks[0]["batch_size"]) == (ranks[1]["learning_rate"], ranks[1]["batch_size"])
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    proposals = [search_task.optuna_space(study.ask()) for _ in range(2)]
    assert ranks[0]["learning_rate"] == proposals[-1]["learning_rate"]  # the last trial's arguments stay set
    assert ranks[0]["best"][2] in proposals


def test_call_model_init_with_or_without_the_trial(tmp_path):
    trainer = search_task.trainer(trainkit, str(tmp_path))
    trial = optuna.trial.FixedTrial({"hidden": 16})
    assert trainer.call_model_init(trial).net[0].out_features == 16  # model_init(trial)
    assert trainer.call_model_init().net[0].out_features == 8  # model_init(None), as at construction
    trainer.model_init = lambda: search_task.Regressor(4)
    assert trainer.call_model_init(trial).net[0].out_features == 4  # no argument: called without the trial
    trainer.model_init = lambda trial, extra: None
    with pytest.raises(RuntimeError, match="none or one"):
        trainer.call_model_init()
    trainer.model_init = lambda: None
    with pytest.raises(RuntimeError, match="returned None"):
        trainer.call_model_init()


def test_a_trial_sets_its_arguments_with_their_types_and_rebuilds_the_engine(tmp_path, caplog):
    trainer = search_task.trainer(trainkit, str(tmp_path))
    trainer.hp_search_backend = "optuna"
    trainer.hp_space = lambda trial: {"per_device_train_batch_size": 16.0, "gradient_accumulation_steps": "2",
                                      "not_a_field": 1}
    with caplog.at_level(logging.WARNING):
        trainer._hp_search_setup(optuna.trial.FixedTrial({}))
    assert trainer.args.per_device_train_batch_size == 16 and isinstance(trainer.args.per_device_train_batch_size, int)
    assert trainer.args.gradient_accumulation_steps == 2
    assert trainer.accelerator.config.gradient_accumulation_steps == 2  # the engine is rebuilt from the arguments
    assert "not_a_field" in caplog.text
    assert trainer._get_output_dir(optuna.trial.FixedTrial({}, 7)) == os.path.join(str(tmp_path), "run-7")
    trainer.hp_name = lambda trial: f"lr-{trial.number}"
    assert trainer._get_output_dir(optuna.trial.FixedTrial({}, 7)) == os.path.join(str(tmp_path), "lr-7")
    trainer.hp_search_backend = None
    assert trainer._get_output_dir(optuna.trial.FixedTrial({}, 7)) == str(tmp_path)


@pytest.mark.parametrize("backend, error, match", [
    ("wandb", ValueError, "W&B sweeps are not supported"),
    ("sigopt", ValueError, "valid backends are"),
])
def test_unsupported_backends_are_refused(tmp_path, backend, error, match):
    with pytest.raises(error, match=match):
        search_task.trainer(trainkit, str(tmp_path)).hyperparameter_search(backend=backend)


def test_a_search_needs_model_init(tmp_path):
    trainer = trainkit.Trainer(model=search_task.Regressor(), args=trainkit.TrainingArguments(
        str(tmp_path), use_cpu=True, report_to="none"), train_dataset=search_task.Data(8, 0))
    with pytest.raises(RuntimeError, match="model_init"):
        trainer.hyperparameter_search(backend="optuna", n_trials=1)
