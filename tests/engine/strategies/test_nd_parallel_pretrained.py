"""A model ``from_pretrained(distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))`` sharded is accepted by
the Trainer as it is (no second wrapping), trains as one process and saves one full safetensors file.
CPU, gloo, 4 processes (tests/engine/workers/nd_pretrained.py) and one plain process for the reference.
With a transformers that applies tp_size or fsdp_size but not both (5.17), the model is loaded with
DistributedConfig(fsdp_size=4) instead (the worker's ``loading_layout``)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import ENGINE_WORKERS, run_python, run_torchrun

pytestmark = pytest.mark.multiprocess  # 4 gloo processes (CPU)

WORKER = ENGINE_WORKERS / "nd_pretrained.py"
RELATIVE = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("transformers.distributed")  # DistributedConfig's sharded loading (transformers 5.x)
    # from_pretrained(distributed_config=...) passes transformers a device_map, which it refuses without accelerate
    pytest.importorskip("accelerate", reason="transformers' sharded loading needs the accelerate package")
    import sys

    sys.path.insert(0, str(WORKER.parent))
    from nd_parallel import build_model
    from nd_pretrained import loading_layout

    out = tmp_path_factory.mktemp("nd_pretrained")
    build_model(tied=False).save_pretrained(out / "pretrained")
    run_torchrun(WORKER, "sharded", str(out / "pretrained"), str(out), nproc=4, timeout=300)
    run_python(WORKER, "single", str(out / "pretrained"), str(out), timeout=300)
    runs = {mode: torch.load(out / f"pretrained_{mode}.pt", weights_only=False) for mode in ("sharded", "single")}
    return {"out": out, "loaded_as": loading_layout(), **runs}


def _expected(runs: dict) -> tuple[int, int]:
    """(dp_shard, tp) the model was loaded with."""
    loaded = runs["loaded_as"]
    return loaded["fsdp_size"], loaded.get("tp_size", 1)


def test_trainer_keeps_the_transformers_sharded_model_and_trains_as_one_process(runs: dict) -> None:
    sharded, single = runs["sharded"], runs["single"]
    shard, tp = _expected(runs)
    kind = "TP x FSDP" if tp > 1 else "FSDP"
    assert sharded["layout"] == f"dp_replicate=1 x dp_shard={shard} x tp={tp} ({kind})"  # from the model's mesh
    assert sharded["same_parameters"]  # prepare kept transformers' DTensor parameters: nothing was wrapped again
    for key in ("losses", "norms"):
        assert len(sharded[key]) == len(single[key]) == 4
        assert max(abs(a - b) / abs(b) for a, b in zip(sharded[key], single[key])) < RELATIVE


def test_a_fresh_trainer_resumes_the_sharded_models_checkpoint_and_ends_as_the_uninterrupted_run(runs: dict) -> None:
    """The sharded run's Trainer checkpoint after 2 of 4 steps, resumed with a model loaded again with the same
    distributed_config: the last 2 steps' losses and gradient norms, and the saved model, are the uninterrupted
    run's (which matches one process, above)."""
    from safetensors.torch import load_file

    resumed, uninterrupted = runs["sharded"]["resumed"], runs["sharded"]
    assert resumed["steps"] == [1, 2, 3, 4]  # the checkpoint's history, then the 2 steps trained after resuming
    for key in ("losses", "norms"):
        assert max(abs(a - b) / abs(b) for a, b in zip(resumed[key][2:], uninterrupted[key][2:])) < RELATIVE
    final = load_file(runs["out"] / "saved_resumed" / "model.safetensors")
    expected = load_file(runs["out"] / "saved_sharded" / "model.safetensors")
    assert sorted(final) == sorted(expected)
    for name, value in expected.items():
        assert (final[name] - value).norm() / value.norm() < RELATIVE, name


def test_saved_model_is_one_full_safetensors_file(runs: dict) -> None:
    from safetensors.torch import load_file

    sharded = load_file(runs["out"] / "saved_sharded" / "model.safetensors")
    single = load_file(runs["out"] / "saved_single" / "model.safetensors")
    assert sorted(sharded) == sorted(single)
    for name, expected in single.items():
        assert sharded[name].shape == expected.shape
        assert (sharded[name] - expected).norm() / expected.norm() < RELATIVE, name


def test_an_accelerator_reading_data_differently_refuses_it(runs: dict) -> None:
    """A plain Accelerator (DDP over 4 processes) is not laid out as the model: prepare says which
    ParallelismConfig fits."""
    shard, tp = _expected(runs)
    assert f"ParallelismConfig(dp_replicate_size=1, dp_shard_size={shard}, tp_size={tp})" in runs["sharded"]["refusal"]
