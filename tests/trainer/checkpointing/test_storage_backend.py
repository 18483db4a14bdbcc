"""The Trainer's checkpoints go through the Accelerator's storage backend (``accelerator.checkpoint_io``) at
every step: writing, rotating, finding the folder to resume from and verifying it. CPU, one process."""

import pytest

from tests.trainer.checkpoint_workload import make_trainer
from trainkit.engine.checkpoint import storage

pytestmark = pytest.mark.timeout(180)


class RecordingIO(storage.AtomicPosixIO):
    """The default backend, noting which of its methods were called."""

    def __init__(self) -> None:
        self.calls: set[str] = set()

    def __getattribute__(self, name):
        if name in ("stage", "commit", "list", "latest", "read", "rotate"):
            object.__getattribute__(self, "calls").add(name)
        return object.__getattribute__(self, name)


def test_saving_rotating_and_resuming_ask_the_backend(tmp_path):
    output_dir = str(tmp_path / "out")
    first = make_trainer(output_dir, max_steps=4, stop_after=3, save_total_limit=2, eval_strategy="no")
    first.accelerator.checkpoint_io = writer = RecordingIO()
    first.train()
    assert {"stage", "commit", "rotate"} <= writer.calls

    resumed = make_trainer(output_dir, max_steps=4, save_total_limit=2, eval_strategy="no")
    resumed.accelerator.checkpoint_io = reader = RecordingIO()
    assert resumed.train(resume_from_checkpoint=True).global_step == 4
    assert {"latest", "list", "read"} <= reader.calls  # the folder was found and verified through it


def test_accelerator_load_state_finds_the_latest_through_the_backend(tmp_path):
    from torch import nn

    from trainkit import Accelerator
    from trainkit.utils import ProjectConfiguration

    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                  automatic_checkpoint_naming=True))
    model = accelerator.prepare(nn.Linear(2, 2))
    accelerator.save_state()
    accelerator.checkpoint_io = io = RecordingIO()
    accelerator.load_state()
    assert {"latest", "list", "read"} <= io.calls
    assert model.weight.shape == (2, 2)
