"""The Trainer and the engine read one list of trackers, precisions and devices, so they cannot disagree; and a
Trainer leaves no tracker file open (CPU, one process, plus one plain subprocess for MLflow)."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from tests.distributed import REPO, worker_env
from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit import Accelerator, TrainingArguments
from trainkit.engine.process.devices import DEVICE_TYPES
from trainkit.engine.precision.registry import PRECISION_DEVICES, PRECISIONS
from trainkit.engine.tracking import OPTIONAL_TRACKERS as _OPTIONAL, tracker_names

pytestmark = pytest.mark.timeout(240)
INSTALLED = [name for name in tracker_names() if name == "jsonl" or _OPTIONAL[name][1]()]


@pytest.mark.parametrize("name", tracker_names())
def test_report_to_accepts_every_tracker_the_engine_has(tmp_path, name):
    args = TrainingArguments(str(tmp_path), report_to=name)
    assert args.report_to == [name]
    if name in INSTALLED:  # the engine takes the same name (an ImportError names the package otherwise)
        Accelerator(cpu=True, log_with=name, project_dir=str(tmp_path))


def test_report_to_refuses_a_tracker_the_engine_lacks(tmp_path):
    with pytest.raises(ValueError, match=r"'neptune' for 'report_to'.*mlflow"):
        TrainingArguments(str(tmp_path), report_to="neptune")


def test_every_precision_runs_everywhere_the_table_says_and_the_trainer_accepts_it(tmp_path):
    assert set(PRECISION_DEVICES) == set(PRECISIONS) and "cpu" in DEVICE_TYPES
    for mode, devices in PRECISION_DEVICES.items():
        if "cpu" in devices:
            flags = {"fp16": dict(fp16=True), "bf16": dict(bf16=True), "no": {}}[mode]
            assert TrainingArguments(str(tmp_path), use_cpu=True, **flags).mixed_precision == mode
            assert Accelerator(cpu=True, mixed_precision=mode).mixed_precision == mode


def test_fp16_on_cpu_trains_with_a_loss_scaler_as_the_engine_does(tmp_path):
    """transformers accepts fp16=True with use_cpu=True; so does trainkit, and it changes the run (CPU)."""
    fp16 = make_trainer(str(tmp_path / "fp16"), max_steps=3, fp16=True, use_cpu=True, save_strategy="no")
    fp16.train()
    assert fp16.accelerator.mixed_precision == "fp16" and fp16.accelerator.scaler is not None
    assert fp16.accelerator.scaler.get_scale() > 1  # the loss was scaled
    full = make_trainer(str(tmp_path / "fp32"), max_steps=3, use_cpu=True, save_strategy="no")
    full.train()
    a, b = final_weights(fp16), final_weights(full)
    assert any(not torch.equal(a[key], b[key]) for key in a)  # float16 autocast rounds: not the fp32 run


def _open_files_under(folder: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts file descriptors through /proc (Linux)")
@pytest.mark.parametrize("report_to", ["jsonl", *[["jsonl", n] for n in INSTALLED if n == "tensorboard"]])
def test_evaluate_after_train_leaves_no_tracker_file_open(tmp_path, report_to):
    output_dir = str(tmp_path / "out")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(2):  # one handle more per run, before the fix
            trainer = make_trainer(output_dir, max_steps=2, save_strategy="no", report_to=report_to)
            trainer.train()
            trainer.evaluate()
            trainer.evaluate()
            assert _open_files_under(str(tmp_path)) == []
            del trainer
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    lines = open(os.path.join(output_dir, "logs", "metrics.jsonl")).read().splitlines()
    assert sum("eval_loss" in json.loads(line) for line in lines) >= 4  # every evaluation is in the log


MLFLOW_RUN = """
import json, sys
sys.path.insert(0, sys.argv[2])
from tests.trainer.checkpoint_workload import make_trainer
trainer = make_trainer(sys.argv[1], max_steps=2, save_strategy="no", eval_strategy="no", report_to="mlflow",
                       run_name="agreement")
trainer.train()
import mlflow
client = mlflow.tracking.MlflowClient()
run = client.search_runs([client.get_experiment_by_name("agreement").experiment_id])[0]
print("MLFLOW " + json.dumps([(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")]))
"""


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed (extra 'mlflow')")
def test_report_to_mlflow_sends_the_training_loss_to_mlflow(tmp_path):
    env = worker_env(MLFLOW_TRACKING_URI=(tmp_path / "mlruns").as_uri(), MLFLOW_ALLOW_FILE_STORE="true")
    result = subprocess.run([sys.executable, "-c", MLFLOW_RUN, str(tmp_path / "out"), str(REPO)], capture_output=True,
                            text=True, timeout=200, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    history = json.loads(result.stdout.split("MLFLOW ", 1)[1].splitlines()[0])
    assert [step for step, _ in history] == [1, 2]
