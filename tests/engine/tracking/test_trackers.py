"""Trackers as Accelerate drives them, on one CPU process: TensorBoard receives dict values as scalar groups;
W&B (offline files) and MLflow (local file store) receive the logged metrics; skipped only if not installed.
Also: trainkit itself never imports ``accelerate`` (peft, in the dev extra, would bring it in).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import REPO, worker_env

LOGGED = [({"loss": 1.5, "accuracy": {"train": 0.5, "eval": 0.25}}, 1), ({"loss": 1.0}, 2)]
TRACKERS = [name for name in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(name) is not None]

LOG_RUN = """
import json, sys
from trainkit import Accelerator
a = Accelerator(cpu=True, log_with=json.loads(sys.argv[2]), project_dir=sys.argv[1])
a.init_trackers("surface_run", config={"lr": 0.1, "optimizer": "sgd"})
for values, step in json.loads(sys.argv[3]):
    a.log(values, step=step)
a.end_training()
if "mlflow" in sys.argv[2]:  # read back through MLflow's own client
    import mlflow
    client = mlflow.tracking.MlflowClient()
    run = client.search_runs([client.get_experiment_by_name("surface_run").experiment_id])[0]
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")]
    print("MLFLOW " + json.dumps({"loss": history, "params": run.data.params}))
"""


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One plain process logs to every installed tracker: init_trackers, two log calls, end_training."""
    out = tmp_path_factory.mktemp("trackers")
    env = worker_env(
        WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(out / "wandb_config"),
        WANDB_CACHE_DIR=str(out / "wandb_cache"),
        # MLflow 3 keeps the local file store behind an opt-in; it needs no database or server.
        MLFLOW_TRACKING_URI=(out / "mlruns").as_uri(), MLFLOW_ALLOW_FILE_STORE="true")
    result = subprocess.run([sys.executable, "-c", LOG_RUN, str(out), json.dumps(TRACKERS), json.dumps(LOGGED)],
                            capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result


def test_tensorboard_receives_nested_dicts_as_scalar_groups(logged_run):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (extra 'tensorboard')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = logged_run[0] / "surface_run"

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


def test_wandb_offline_files_hold_the_logged_metrics(logged_run):
    pytest.importorskip("wandb", reason="wandb is not installed (extra 'wandb')")
    tmp_path = logged_run[0]
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


@pytest.mark.skipif("mlflow" not in TRACKERS, reason="mlflow is not installed (extra 'mlflow')")
def test_mlflow_local_file_store_holds_the_logged_metrics(logged_run):
    result = logged_run[1]
    assert "'accuracy'" in result.stderr  # a dict is not an MLflow metric: skipped with a warning, as in Accelerate
    stored = json.loads(result.stdout.split("MLFLOW ", 1)[1].splitlines()[0])
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
