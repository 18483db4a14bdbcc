"""Trackers as Accelerate drives them, on one CPU process: TensorBoard receives dict values as scalar groups;
W&B (offline files) and MLflow (local file store) receive the logged metrics; skipped only if not installed.
Also: trainkit itself never imports ``accelerate`` (peft, in the dev extra, would bring it in).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import REPO, worker_env

LOGGED = [({"loss": 1.5, "accuracy": {"train": 0.5, "eval": 0.25}}, 1), ({"loss": 1.0}, 2)]


def _log_run(tmp_path: Path, log_with: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One plain process: init_trackers, two log calls, end_training (each tracker owns process-wide state)."""
    code = (
        "import sys, json\n"
        "from trainkit import Accelerator\n"
        f"a = Accelerator(cpu=True, log_with={log_with!r}, project_dir=sys.argv[1])\n"
        "a.init_trackers('surface_run', config={'lr': 0.1, 'optimizer': 'sgd'})\n"
        f"for values, step in {LOGGED!r}:\n"
        "    a.log(values, step=step)\n"
        "a.end_training()\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=180,
                            env=worker_env(**(env or {})), cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_tensorboard_receives_nested_dicts_as_scalar_groups(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (extra 'tensorboard')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_run(tmp_path, "tensorboard")
    run = tmp_path / "surface_run"

    def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
        events = EventAccumulator(str(folder))
        events.Reload()
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert scalars(run, "loss") == [(1, 1.5), (2, 1.0)]
    # add_scalars("accuracy", {...}): one sub-run per entry, all under the tag "accuracy".
    assert scalars(run / "accuracy_train", "accuracy") == [(1, 0.5)]
    assert scalars(run / "accuracy_eval", "accuracy") == [(1, 0.25)]


def _wandb_records(path: Path):
    """The protobuf records of an offline ``.wandb`` file (a ':W&B' header, then LevelDB-style log blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pieces, block = path.read_bytes(), 7, [], 32768
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pieces.append(data[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            yield record


def test_wandb_offline_files_hold_the_logged_metrics(tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (extra 'wandb')")
    _log_run(tmp_path, "wandb", env={"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                                     "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
                                     "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache")})
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    history, config = [], {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    assert history == [{"loss": 1.5, "accuracy/train": 0.5, "accuracy/eval": 0.25, "_step": 1},
                       {"loss": 1.0, "_step": 2}]
    assert config["lr"] == 0.1 and config["optimizer"] == "sgd"


def test_mlflow_local_file_store_holds_the_logged_metrics(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (extra 'mlflow')")
    uri = (tmp_path / "mlruns").as_uri()
    # MLflow 3 keeps the file store behind an opt-in; it needs no database or server.
    result = _log_run(tmp_path, "mlflow", env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"})
    assert "'accuracy'" in result.stderr  # a dict is not an MLflow metric: skipped with a warning, as in Accelerate
    code = (
        "import sys, json, mlflow\n"
        "client = mlflow.tracking.MlflowClient(tracking_uri=sys.argv[1])\n"
        "run = client.search_runs([client.get_experiment_by_name('surface_run').experiment_id])[0]\n"
        "history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, 'loss')]\n"
        "print(json.dumps({'loss': history, 'params': run.data.params}))\n"
    )
    read = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, timeout=120,
                          env=worker_env(MLFLOW_ALLOW_FILE_STORE="true"), cwd=REPO)
    assert read.returncode == 0, read.stderr[-4000:]
    stored = json.loads(read.stdout.strip().splitlines()[-1])
    assert stored["loss"] == [[1, 1.5], [2, 1.0]] and stored["params"] == {"lr": "0.1", "optimizer": "sgd"}


NO_ACCELERATE = """
import sys


class ImporterRecorder:
    # Records which source file asked for each accelerate module (never blocks the import).
    importers = set()

    def find_spec(self, name, path=None, target=None):
        if name == "accelerate" or name.startswith("accelerate."):
            frame = sys._getframe(1)
            while frame and ("importlib" in frame.f_code.co_filename or "<frozen" in frame.f_code.co_filename):
                frame = frame.f_back
            self.importers.add(frame.f_code.co_filename if frame else "?")
        return None


sys.meta_path.insert(0, ImporterRecorder())
import torch
from torch.utils.data import DataLoader, TensorDataset
import trainkit
from trainkit import Accelerator
from trainkit.utils import gather
import trainkit.state, trainkit.data_loader, trainkit.logging

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()
gather(torch.ones(1))
print("engine run, accelerate imported:", "accelerate" in sys.modules)

from trainkit import Trainer, TrainingArguments


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


rows = [{"x": torch.randn(2), "labels": torch.randn(())} for _ in range(8)]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=2, per_device_train_batch_size=4, report_to="none",
                         save_strategy="no", disable_tqdm=True)
Trainer(model=Regression(), args=args, train_dataset=rows).train()
trainkit_files = sorted(f for f in ImporterRecorder.importers if "/trainkit/" in f)
print("importers from trainkit:", trainkit_files)
print("trainer run, accelerate imported:", "accelerate" in sys.modules)
print("accelerate importers:", sorted(ImporterRecorder.importers))
"""


def test_trainkit_never_imports_accelerate(tmp_path):
    # Honest only where accelerate is importable: with it absent, nothing could import it and the check is empty.
    pytest.importorskip("accelerate", reason="accelerate is not installed, so nothing could import it")
    result = subprocess.run([sys.executable, "-c", NO_ACCELERATE, str(tmp_path)], capture_output=True, text=True,
                            timeout=180, env=worker_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    # The engine (Accelerator, trainkit.utils/state/data_loader/logging) runs without accelerate loaded at all.
    assert "engine run, accelerate imported: False" in result.stdout
    # With the Trainer, transformers' own modules (trainer_utils -> peft, generation) import accelerate when it is
    # installed; the recorder proves none of those imports came from a trainkit file, and that it sees importers.
    assert "importers from trainkit: []" in result.stdout
    if "trainer run, accelerate imported: True" in result.stdout:  # the recorder did see who imported it
        assert "site-packages" in result.stdout.split("accelerate importers:")[1]
