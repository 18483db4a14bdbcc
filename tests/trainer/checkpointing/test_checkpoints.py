"""The Trainer's checkpoint-N folders on one process: atomic and pickle-free layout, weights written once,
exact resume from any step, automatic resume after a restart, incomplete ones skipped, rotation, save_only_model.

Device: CPU, as every unmarked test (conftest); the `gpu` tests at the end repeat the exact-resume claims on CUDA.
Bitwise equality of two runs needs the same device for both (CPU and CUDA dropout draw from different
generators) and, on CUDA, deterministic kernels: cuBLAS with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``),
``torch.use_deterministic_algorithms(True)`` and cuDNN's deterministic algorithms, TF32 off (the
``deterministic_cuda_kernels`` fixture). CPU kernels are deterministic as they are.
"""

import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.checkpoint_workload import DropoutRegressor, final_weights, make_trainer
from trainkit.engine.checkpoint import read_manifest, verify_checkpoint
from trainkit.trainer.checkpointing import files as checkpoints

pytestmark = pytest.mark.timeout(180)
STEPS = 16  # 2 epochs of 8 optimizer steps; step 8 ends epoch 1 with a short window
FORWARDS_PER_EPOCH = 22  # 44 samples in batches of 2; windows of 3 micro-batches, the last one of 1
if torch.cuda.is_available():
    # cuBLAS reads its workspace configuration once per process, when a GEMM first needs it. Modules are imported
    # at collection, before any test runs, so this reaches the `gpu` tests below (it changes nothing on CPU).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run of the workload, on CPU (conftest's module-scoped process state), with a checkpoint after every
    step: (output_dir, final weights). Left to itself the engine would pick CUDA on a GPU machine, and every test
    below would compare a CUDA run with CPU runs (that made these tests fail on an H200 by up to 0.44)."""
    output_dir = str(tmp_path_factory.mktemp("uninterrupted") / "out")
    trainer = make_trainer(output_dir)
    assert trainer.accelerator.device.type == "cpu"
    assert trainer.train().global_step == STEPS
    return output_dir, final_weights(trainer)


@pytest.fixture
def deterministic_cuda_kernels():
    """For the CUDA runs that claim bitwise equality: deterministic kernels, TF32 off; restored afterwards."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    # Set at import (above); a test that ran since may have removed it, and torch checks it at every cuBLAS call.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace if workspace in (":4096:8", ":16:8") else ":4096:8"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    if workspace is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = saved[2:]


def _assert_bitwise_equal(expected: dict, actual: dict) -> None:
    assert expected.keys() == actual.keys()
    different = [key for key in expected if not torch.equal(expected[key], actual[key])]
    assert not different, f"differ: {different}, max {max((expected[k] - actual[k]).abs().max().item() for k in different)}"


def test_checkpoint_is_atomic_pickle_free_and_holds_the_weights_once(uninterrupted):
    output_dir, _ = uninterrupted
    folder = checkpoints.checkpoint_folder(output_dir, 5)
    manifest = read_manifest(folder)
    files = set(manifest["files"])
    assert set(os.listdir(folder)) == files | {"manifest.json"}  # the manifest covers every file, the Trainer's too
    assert {"model.safetensors", "trainer_state.json", "training_args.json", "optimizer.json", "dataloaders.json",
            "random_states_0.json", "accelerator_state.json"} <= files
    assert manifest["metadata"] == {"kind": "trainer_checkpoint", "global_step": 5}
    # Pickle-free: tensors in safetensors, everything else JSON; the weights exist once.
    assert {os.path.splitext(name)[1] for name in files} <= {".json", ".safetensors"}
    weight_files = [name for name in files if "model" in name and name.endswith(".safetensors")]
    assert weight_files == ["model.safetensors"]
    assert set(load_file(os.path.join(folder, "model.safetensors"))) == {"layers.0.weight", "layers.0.bias",
                                                                        "layers.3.weight", "layers.3.bias"}
    verify_checkpoint(folder)
    assert not [name for name in os.listdir(output_dir) if name.startswith(".")]  # no staging leftovers
    state = json.loads(open(os.path.join(folder, "trainer_state.json")).read())
    assert state["global_step"] == 5


@pytest.mark.parametrize("stop_after", [3, 8, 13])  # mid-epoch in warmup, the epoch's short last window, mid-epoch 2
def test_resume_from_any_step_reaches_bitwise_the_uninterrupted_weights(uninterrupted, tmp_path, stop_after):
    _, expected = uninterrupted
    output_dir = str(tmp_path / "out")
    interrupted = make_trainer(output_dir, stop_after=stop_after)
    assert interrupted.train().global_step == stop_after
    resumed = make_trainer(output_dir)
    assert resumed.train(resume_from_checkpoint=True).global_step == STEPS
    assert interrupted.accelerator.device.type == resumed.accelerator.device.type == "cpu"  # as the fixture's run
    assert resumed.state.epoch == 2.0
    _assert_bitwise_equal(expected, final_weights(resumed))
    # The log history goes on from the checkpoint's: one training loss per step, none twice.
    steps = [entry["step"] for entry in resumed.state.log_history if "loss" in entry]
    assert steps == list(range(1, STEPS + 1))


def test_after_a_restart_train_resumes_by_itself_and_says_so(uninterrupted, tmp_path, monkeypatch, caplog):
    _, expected = uninterrupted
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, stop_after=6).train()
    # An interrupted write of checkpoint-7 (staging leftover) and a damaged newer folder: both skipped.
    os.makedirs(os.path.join(output_dir, ".checkpoint-7.staging"))
    damaged = checkpoints.checkpoint_folder(output_dir, 99)
    shutil.copytree(checkpoints.checkpoint_folder(output_dir, 6), damaged)
    os.remove(os.path.join(damaged, "manifest.json"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with caplog.at_level(logging.INFO, logger="trainkit"):
        resumed = make_trainer(output_dir)
        resumed.train()  # no argument: the script is unchanged
    assert "Restart 1 of this job: resuming automatically from" in caplog.text
    assert "checkpoint-99" in caplog.text and "Skipping incomplete" in caplog.text
    assert resumed.checkpoint_manager.resumed_from.endswith("checkpoint-6")
    _assert_bitwise_equal(expected, final_weights(resumed))
    assert not os.path.exists(os.path.join(output_dir, ".checkpoint-7.staging"))  # cleared when step 7 was saved

    fresh = make_trainer(output_dir, max_steps=1)
    fresh.train(resume_from_checkpoint=False)  # an explicit False wins over the restart
    assert fresh.checkpoint_manager.resumed_from is None and fresh.state.global_step == 1


def test_restart_before_any_checkpoint_starts_from_the_beginning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        trainer = make_trainer(str(tmp_path / "out"), max_steps=2, save_strategy="no", eval_strategy="no")
        assert trainer.train().global_step == 2
    assert "Restart 2 of this job: no complete checkpoint" in caplog.text
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory"):
        trainer.train(resume_from_checkpoint=True)


def test_rotation_keeps_the_best_and_the_one_resumed_from(tmp_path):
    output_dir = str(tmp_path / "out")
    # A constant score: the first evaluation stays the best.
    limited = dict(save_total_limit=1, metric_for_best_model="score", compute_metrics=lambda prediction: {"score": 1.0})
    make_trainer(output_dir, stop_after=3, **limited).train()
    assert [os.path.basename(p) for p in checkpoints.sorted_checkpoints(output_dir)] == ["checkpoint-1", "checkpoint-3"]
    resumed = make_trainer(output_dir, max_steps=6, **limited)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.best_model_checkpoint.endswith("checkpoint-1")
    names = [os.path.basename(p) for p in checkpoints.sorted_checkpoints(output_dir)]
    assert names == ["checkpoint-1", "checkpoint-3", "checkpoint-6"]  # best, resumed from, newest
    assert not [name for name in os.listdir(output_dir) if name.startswith(".")]


def test_save_only_model_writes_weights_and_state_only_and_still_resumes(tmp_path, caplog):
    output_dir = str(tmp_path / "out")
    make_trainer(output_dir, stop_after=4, save_only_model=True).train()
    folder = checkpoints.checkpoint_folder(output_dir, 4)
    assert set(read_manifest(folder)["files"]) == {"model.safetensors", "trainer_state.json", "training_args.json"}
    saved = load_file(os.path.join(folder, "model.safetensors"))
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        resumed = make_trainer(output_dir, max_steps=5)
        assert resumed.train(resume_from_checkpoint=True).global_step == 5
    assert "holds the weights only (save_only_model)" in caplog.text
    assert [entry["step"] for entry in resumed.state.log_history if "loss" in entry] == [1, 2, 3, 4, 5]
    checkpoints.load_model_weights(resumed, folder)  # as load_best_model_at_end does
    _assert_bitwise_equal(saved, final_weights(resumed))


def test_a_transformers_checkpoint_loads_with_from_pretrained(tmp_path):
    from transformers import BertForSequenceClassification

    from tests.trainer.helpers import tiny_bert
    from trainkit import Trainer, TrainingArguments

    samples = [{"input_ids": torch.tensor([2, 5 + i % 7, 9, 3]), "labels": torch.tensor(i % 2)} for i in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, save_steps=2, per_device_train_batch_size=4,
                             report_to="none", disable_tqdm=True)
    trainer = Trainer(model=tiny_bert(20), args=args, train_dataset=samples)
    trainer.train()
    loaded = BertForSequenceClassification.from_pretrained(checkpoints.checkpoint_folder(args.output_dir, 2))
    _assert_bitwise_equal(final_weights(trainer), {k: v for k, v in loaded.state_dict().items()})


def test_accelerator_load_state_with_automatic_naming_after_a_restart(tmp_path, monkeypatch, caplog):
    from trainkit import Accelerator
    from trainkit.utils.dataclasses import ProjectConfiguration

    def accelerator_and_model(project_dir):
        accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
            project_dir=str(project_dir), automatic_checkpoint_naming=True))
        model = accelerator.prepare(torch.nn.Linear(3, 2))
        return accelerator, model

    saver, model = accelerator_and_model(tmp_path)
    for value in (1.0, 2.0):
        torch.nn.init.constant_(model.weight, value)
        saver.save_state()  # checkpoint_0, checkpoint_1
    os.makedirs(tmp_path / "checkpoints" / "checkpoint_5")  # not complete: skipped
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        restarted, fresh_model = accelerator_and_model(tmp_path)
        restarted.load_state()
        assert torch.equal(fresh_model.weight, torch.full((2, 3), 2.0))
        assert restarted.project_configuration.iteration == 2  # the next save_state() writes checkpoint_2
        nothing_yet, _ = accelerator_and_model(tmp_path / "empty")
        nothing_yet.load_state()  # a restart before the first save: nothing to load, not an error
    assert "Restart 1 of this job: resuming automatically from" in caplog.text and "checkpoint_1" in caplog.text
    assert "no complete checkpoint" in caplog.text
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    with pytest.raises(FileNotFoundError):
        nothing_yet.load_state()  # outside a restart, asking for a checkpoint that does not exist stays an error


class RecordingRegressor(DropoutRegressor):
    """The workload's model; each training forward notes its batch and the state of every random stream."""

    def __init__(self, records: list) -> None:
        super().__init__()
        self.records = records

    def forward(self, x, labels=None):
        if self.training:
            self.records.append(_batch_and_streams(x, labels))
        return super().forward(x, labels)


def _batch_and_streams(x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch and, as tensors, every generator a step can draw from at this point (dropout's among them)."""
    numpy_state = np.random.get_state()
    record = {
        "batch x": x.detach().cpu().clone(), "batch labels": labels.detach().cpu().clone(),
        "torch CPU generator": torch.get_rng_state(),
        "python random": torch.tensor(random.getstate()[1], dtype=torch.int64),
        "numpy": torch.tensor([*numpy_state[1].tolist(), int(numpy_state[2])], dtype=torch.int64),
    }
    if x.is_cuda:
        record["CUDA generator of the batch's device"] = torch.cuda.get_rng_state(x.device)
    return record


def _runs_with_records(tmp_path, stop_after: int):
    """Uninterrupted and interrupted-then-resumed runs of the workload on the current process state's device:
    (records of every training forward of the uninterrupted run, of the resumed run, both final weights)."""
    full, partial, resumed = [], [], []
    reference = make_trainer(str(tmp_path / "full"), model_init=lambda: RecordingRegressor(full))
    reference.train()
    make_trainer(str(tmp_path / "resumed"), stop_after=stop_after, model_init=lambda: RecordingRegressor(partial)).train()
    again = make_trainer(str(tmp_path / "resumed"), model_init=lambda: RecordingRegressor(resumed))
    assert again.train(resume_from_checkpoint=True).global_step == STEPS
    assert reference.accelerator.device == again.accelerator.device
    return full, resumed, final_weights(reference), final_weights(again), again.accelerator.device


def _assert_same_batches_and_streams(full: list, resumed: list, stop_after: int) -> None:
    done = stop_after * 3 if stop_after * 3 <= FORWARDS_PER_EPOCH else None
    assert done is not None, "pick a stop step inside the first epoch's full windows"
    assert len(resumed) == len(full) - done
    for offset, (expected, actual) in enumerate(zip(full[done:], resumed)):
        assert expected.keys() == actual.keys()
        different = [name for name in expected if not torch.equal(expected[name], actual[name])]
        assert not different, f"training forward {done + offset + 1}: {different} differ from the uninterrupted run's"


def test_after_resume_every_forward_sees_the_uninterrupted_batch_and_random_streams(tmp_path):
    """CPU: the mechanism behind bitwise resume, stream by stream. At every training forward after resuming from
    step 5, the batch and the states of torch's CPU generator (dropout's), python's and numpy's equal, as tensors,
    those of the uninterrupted run at the same forward; the final weights follow."""
    full, resumed, expected, actual, device = _runs_with_records(tmp_path, stop_after=5)
    assert device.type == "cpu"
    _assert_same_batches_and_streams(full, resumed, stop_after=5)
    _assert_bitwise_equal(expected, actual)


@pytest.mark.gpu
def test_resume_on_cuda_continues_every_stream_and_reaches_bitwise_the_uninterrupted_weights(
        tmp_path, deterministic_cuda_kernels):
    """CUDA, one process (deterministic kernels, TF32 off): the same as on CPU, plus the CUDA generator dropout
    draws from on the GPU; a stream or batch that differs is named."""
    full, resumed, expected, actual, device = _runs_with_records(tmp_path, stop_after=5)
    assert device.type == "cuda"
    assert "CUDA generator of the batch's device" in full[0]
    _assert_same_batches_and_streams(full, resumed, stop_after=5)
    _assert_bitwise_equal(expected, actual)


RESTORE_BEFORE_CUDA_INIT = """
import json, sys, torch
from trainkit.engine.checkpoint.rng import restore_rng_state
state, expected = json.load(open(sys.argv[1]))
torch.manual_seed(7)  # queued: CUDA is not initialised yet in this fresh process, as in a script that seeds first
assert not torch.cuda.is_initialized()
restore_rng_state(state, torch.device("cuda", 0))
print(json.dumps(torch.rand(5, device="cuda").tolist() == expected))
"""


@pytest.mark.gpu
def test_cuda_states_restored_before_cuda_is_initialised_are_kept(tmp_path):
    """CUDA, a fresh process: a seed set before CUDA exists is queued by torch and run at initialisation after
    queued states; restoring must still leave the checkpoint's state in place (the next draws are the saved ones)."""
    from trainkit.engine.checkpoint.rng import capture_rng_state

    torch.manual_seed(7)
    torch.rand(3, device="cuda")  # moves the generator past the seed's start
    state = capture_rng_state()
    expected = torch.rand(5, device="cuda").tolist()
    (tmp_path / "state.json").write_text(json.dumps([state, expected]))
    repo = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", RESTORE_BEFORE_CUDA_INIT, str(tmp_path / "state.json")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "true", result.stdout


def test_cuda_states_in_a_checkpoint_are_harmless_where_cuda_is_absent(monkeypatch, caplog):
    """CPU (CUDA hidden): a checkpoint written on a GPU machine holds CUDA states; where CUDA is absent the CPU,
    python and numpy streams are restored all the same and one line says the CUDA ones are not."""
    import base64

    from trainkit.engine.checkpoint.rng import capture_rng_state, restore_rng_state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.manual_seed(3)
    state = capture_rng_state()
    state["cuda"] = [base64.b64encode(bytes(16)).decode("ascii")]  # seed 0, offset 0: the layout torch writes
    expected = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(99)
    with caplog.at_level(logging.INFO, logger="trainkit"):
        restore_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected[0]) and (random.random(), np.random.rand()) == expected[1:]
    assert "this run has no CUDA" in caplog.text
