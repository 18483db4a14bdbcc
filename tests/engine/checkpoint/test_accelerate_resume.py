"""Resuming the way Accelerate scripts resume, and ``load_state`` for every optimizer and object, in real processes.

Three launches of ``workers/accelerate_resume.py`` (CPU, gloo; about a minute on 2 cores): one process,
DDP on 2 ranks, FSDP2 on 2 ranks. Each runs the loop of Accelerate's ``examples/by_feature/checkpointing.py``
uninterrupted, then resumed from its ``step_N`` / ``epoch_0`` checkpoints by a fresh, differently seeded
run, and compares the final weights and the global sample order. Results come back as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import ENGINE_WORKERS, run_python, run_torchrun, worker_env

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

WORKER = ENGINE_WORKERS / "accelerate_resume.py"
CPU_ENV = worker_env(CUDA_VISIBLE_DEVICES="")  # gloo on CPU even where GPUs exist
MODES = {
    "one_process": lambda out: run_python(WORKER, "--out", out, env=CPU_ENV, timeout=300),
    "ddp_2_ranks": lambda out: run_torchrun(WORKER, "--out", out, nproc=2, env=CPU_ENV, timeout=300),
    "fsdp_2_ranks": lambda out: run_torchrun(WORKER, "--out", out, "--fsdp", "SHARDED_STATE_DICT", nproc=2,
                                             env=CPU_ENV, timeout=300),
}
RESUME_SCENARIOS = ("step_mid_epoch", "step_epoch_end", "epoch", "stateful")


@pytest.fixture(scope="module", params=sorted(MODES))
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp(request.param)
    MODES[request.param](out)
    return json.loads((out / "results.json").read_text())


def test_prepared_loader_len_never_changes_on_resume(results: dict) -> None:
    # Accelerate's scripts compute starting_epoch = resume_step // len(train_dataloader) after load_state.
    full = results["steps_per_epoch"]
    for name in RESUME_SCENARIOS:
        scenario = results[name]
        assert (scenario["len_before_load"], scenario["len_after_load"], scenario["len_after_training"]) == (full,) * 3, name
    mid = results["step_mid_epoch"]
    assert mid["skip_view_len"] == full - full // 2  # only the view skip_first_batches returns is shorter


@pytest.mark.parametrize("scenario", RESUME_SCENARIOS)
def test_resume_continues_exactly_like_the_uninterrupted_run(results: dict, scenario: str) -> None:
    outcome, full = results[scenario], results["steps_per_epoch"]
    assert outcome["starting_epoch"] == 1
    assert outcome["last_step"] == outcome["reference_last_step"] == 3 * full
    expected_steps = {"step_mid_epoch": 3 * full - (full + full // 2), "stateful": 3 * full - (full + full // 2)}
    assert outcome["steps_resumed"] == expected_steps.get(scenario, 2 * full)
    assert outcome["order_matches"], "the resumed run read other samples than the uninterrupted one"
    assert outcome["max_weight_difference"] == 0.0


def test_load_state_restores_optimizers_without_state_and_registered_objects(results: dict) -> None:
    objects = results["objects"]
    assert objects["first_difference"] == 0.0 and objects["second_difference"] == 0.0  # two models
    assert objects["sgd_state_empty"] and objects["sgd_lr"] == 0.05  # SGD without momentum: hyper-parameters only
    assert objects["adam_state_empty"]  # Adam saved before its first step stays unstepped
    assert objects["adam_first_step_difference"] == 0.0  # ... and its first step equals the original's
    assert objects["counter"] == 42  # register_for_checkpointing
