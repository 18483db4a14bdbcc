"""A Trainer checkpoint saved on 2 processes resumes on 1 with the same global batch: the accumulation doubles
(3 -> 6) before the run is planned, the data continues at the next global sample, and the run ends where the
uninterrupted 2-process run ends. One torchrun launch of 2 gloo processes (~20 s), then one CPU process here.
"""

import logging

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_torchrun
from tests.trainer.checkpoint_workload import final_weights, make_trainer
from tests.trainer.elastic_resume_model import PlainRegressor

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_a_two_process_checkpoint_resumes_on_one_process_with_doubled_accumulation(tmp_path, caplog):
    run_torchrun(__file__.replace("test_elastic_resume.py", "elastic_resume_worker.py"), str(tmp_path), nproc=2)
    trainer = make_trainer(str(tmp_path / "stopped"), model_init=PlainRegressor)
    with caplog.at_level(logging.WARNING):
        output = trainer.train(resume_from_checkpoint=True)
    assert trainer.accelerator.config.gradient_accumulation_steps == 6 and output.global_step == 8
    assert trainer.args.gradient_accumulation_steps == 3  # the arguments stay what the script wrote
    assert "World size 2 -> 1" in caplog.text and "gradient_accumulation_steps 3 -> 6" in caplog.text
    expected = load_file(str(tmp_path / "full.safetensors"))
    got = final_weights(trainer)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-7, msg=name)
