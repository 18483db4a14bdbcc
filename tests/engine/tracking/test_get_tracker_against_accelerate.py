"""``get_tracker`` compared with Accelerate's, on one CPU process per library, with the real libraries: TensorBoard
event files, W&B offline files and an MLflow local file store (skipped only where a package is not installed).

The same script runs once with ``import accelerate`` and once with ``import trainkit``: ``get_tracker(name,
unwrap=True)`` must be the library's own object (``SummaryWriter``, the W&B run, MLflow's ``ActiveRun``) in both,
``get_tracker(name)`` a ``GeneralTracker`` with Accelerate's attributes, and what each object writes must land.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import REPO, worker_env

TRACKERS = [name for name in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(name) is not None]
LIBRARIES = ["trainkit", *(["accelerate"] if importlib.util.find_spec("accelerate") else [])]

SCRIPT = """
import importlib, json, sys
import numpy as np

library, out, trackers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
accelerate = importlib.import_module(library)
tracking = importlib.import_module(library + ".tracking")
accelerator = accelerate.Accelerator(cpu=True, log_with=trackers, project_dir=out)
blank = accelerator.get_tracker("tensorboard", unwrap=True)  # nothing started yet (as on other processes)
report = {"before_init": [type(blank).__name__, hasattr(blank, "tracker")]}
accelerator.init_trackers("run", config={"lr": 0.1})
for name in trackers:
    wrapper, raw = accelerator.get_tracker(name), accelerator.get_tracker(name, unwrap=True)
    report[name] = {"raw": type(raw).__module__.split(".")[0] + "." + type(raw).__qualname__,
                    "raw_is_wrapper_tracker": raw is wrapper.tracker, "general": isinstance(wrapper, tracking.GeneralTracker),
                    "attributes": [wrapper.name, wrapper.requires_logging_directory, wrapper.main_process_only]}
images = np.linspace(0, 1, 2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
if "tensorboard" in trackers:
    accelerator.get_tracker("tensorboard", unwrap=True).add_images("raw_images", images, 1)
    accelerator.get_tracker("tensorboard").log_images({"wrapped_images": images}, step=2)
    if library == "trainkit":  # trainkit's wrapper also answers with the writer's methods (Accelerate < 0.17's API)
        accelerator.get_tracker("tensorboard").add_images("old_api_images", images, 3)
    report["tensorboard"]["folder"] = accelerator.get_tracker("tensorboard").logging_dir
if "wandb" in trackers:
    accelerator.get_tracker("wandb", unwrap=True).log({"raw_metric": 3.0}, step=3)
    accelerator.get_tracker("wandb").log_table("table", columns=["a"], data=[[1]], step=4)
if "mlflow" in trackers:
    import mlflow
    run = accelerator.get_tracker("mlflow", unwrap=True)
    report["mlflow"]["active"] = run.info.run_id == mlflow.active_run().info.run_id
    with open(out + "/note.txt", "w") as handle:
        handle.write("artifact")
    accelerator.get_tracker("mlflow").log_artifact(out + "/note.txt")
    report["mlflow"]["artifact_uri"] = run.info.artifact_uri
try:
    accelerator.get_tracker("no_such_tracker")
except ValueError:
    report["unknown"] = "ValueError"
accelerator.end_training()
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Each library's report and output folder (one subprocess each: W&B and MLflow keep process-wide state)."""
    if "tensorboard" not in TRACKERS:
        pytest.skip("tensorboard is not installed (extra 'tensorboard')")
    started = {}
    for library in LIBRARIES:  # both at once: each is mostly the libraries' import time
        out = tmp_path_factory.mktemp(library)
        env = worker_env(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(out / "wandb_config"),
                         WANDB_CACHE_DIR=str(out / "wandb_cache"), WANDB_DIR=str(out),
                         MLFLOW_TRACKING_URI=(out / "mlruns").as_uri(), MLFLOW_ALLOW_FILE_STORE="true")
        started[library] = (out, subprocess.Popen([sys.executable, "-c", SCRIPT, library, str(out), json.dumps(TRACKERS)],
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                                  cwd=REPO))
    results = {}
    for library, (out, process) in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-4000:]
        results[library] = (out, json.loads(stdout.split("REPORT ", 1)[1].splitlines()[0]))
    return results


def test_unwrap_returns_the_library_object_and_the_wrapper_has_accelerate_attributes(reports):
    _, report = reports["trainkit"]
    assert report["tensorboard"]["raw"] == "torch.SummaryWriter"
    for name in TRACKERS:
        assert report[name]["raw_is_wrapper_tracker"] and report[name]["general"]
        assert report[name]["attributes"][0] == name and report[name]["attributes"][2] is True  # main process only
    assert report["before_init"] == ["GeneralTracker", False] and report["unknown"] == "ValueError"
    if "mlflow" in TRACKERS:
        assert report["mlflow"]["raw"] == "mlflow.ActiveRun" and report["mlflow"]["active"]
    if "wandb" in TRACKERS:
        assert report["wandb"]["raw"].startswith("wandb.")


def test_reports_equal_accelerates(reports):
    if "accelerate" not in reports:
        pytest.skip("accelerate (the oracle) is not installed")

    trainkit_report, accelerate_report = (json.loads(json.dumps(reports[name][1])) for name in ("trainkit", "accelerate"))
    if "wandb" in TRACKERS:
        # The one documented difference: Accelerate starts a W&B run on every process (main_process_only=False),
        # trainkit on the main process only (one run per job; docs/migrating-from-accelerate.md).
        assert trainkit_report["wandb"]["attributes"].pop() is True
        assert accelerate_report["wandb"]["attributes"].pop() is False

    def comparable(report: dict) -> dict:
        # Folders differ (one per library); everything else must match.
        drop = {"folder", "artifact_uri"}
        return {k: ({kk: vv for kk, vv in v.items() if kk not in drop} if isinstance(v, dict) else v)
                for k, v in report.items()}

    assert comparable(trainkit_report) == comparable(accelerate_report)


def test_images_written_through_both_objects_reach_the_event_files(reports):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for library, (_, report) in reports.items():
        events = EventAccumulator(report["tensorboard"]["folder"], size_guidance={"images": 0})
        events.Reload()
        old_api = ["old_api_images"] if library == "trainkit" else []
        assert sorted(events.Tags()["images"]) == [*old_api, "raw_images", "wrapped_images"], library
        # add_images writes one grid per call, at the step given
        assert [(e.step, e.width) for e in events.Images("raw_images")] == [(1, 8)], library
        assert [e.step for e in events.Images("wrapped_images")] == [2], library


def test_wandb_run_and_mlflow_run_receive_what_was_logged(reports):
    for library, (out, report) in reports.items():
        if "wandb" in TRACKERS:
            (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
            assert b"raw_metric" in run_file.read_bytes() and b"table" in run_file.read_bytes(), library
        if "mlflow" in TRACKERS:
            artifacts = Path(report["mlflow"]["artifact_uri"].removeprefix("file://"))
            assert (artifacts / "note.txt").read_text() == "artifact", library
