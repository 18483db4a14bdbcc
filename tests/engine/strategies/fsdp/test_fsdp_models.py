"""FSDP2 on the models users fine-tune, in real gloo processes (CPU): BERT, tied GPT-2, tied and untied
Llama, T5's shared embedding and a PEFT LoRA wrapper, crossed with every wrap policy and strategy.

Three launches (2 ranks: FULL_SHARD / SHARD_GRAD_OP plus reloads, merge-weights, mixed dtypes, meta
loading, save-then-load; 4 ranks: HYBRID_SHARD; 1 process: save-then-load). The worker
(workers/fsdp_model_matrix.py) iterates the matrix and writes JSON; each configuration is one test here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.distributed import ENGINE_WORKERS, run_torchrun, worker_env

sys.path.insert(0, str(ENGINE_WORKERS))
from fsdp_zoo import MODELS  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORKER = ENGINE_WORKERS / "fsdp_model_matrix.py"
CPU_ENV = worker_env(CUDA_VISIBLE_DEVICES="")  # gloo on CPU even where a GPU exists
LOSS_TOLERANCE = 1e-4
POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
LAUNCHES = {"two": 2, "hybrid": 4, "one": 1}
_launched: dict[str, dict] = {}


def matrix(mode: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The launch for ``mode`` (run once per session, then shared by its tests)."""
    if mode not in _launched:
        folder = tmp_path_factory.mktemp(f"fsdp-models-{mode}")
        run_torchrun(WORKER, folder, mode, nproc=LAUNCHES[mode], timeout=420, env=CPU_ENV)
        _launched[mode] = json.loads((folder / f"matrix_{mode}.json").read_text())
    return _launched[mode]


def entry(results: dict, key: str) -> dict:
    value = results[key]
    assert "error" not in value, value.get("trace", value)
    return value


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", list(MODELS))
def test_model_matches_ddp(tmp_path_factory, model: str, policy: str, strategy: str) -> None:
    results = matrix("hybrid" if strategy == "HYBRID_SHARD" else "two", tmp_path_factory)
    assert results[f"{model}/ddp"]["distributed_type"] == "MULTI_CPU"
    value = entry(results, f"{model}/{policy}/{strategy}")
    assert value["loss_diff"] <= LOSS_TOLERANCE, value
    assert value["ties_kept"], "tied parameters are still one parameter after sharding"
    assert value["trainable_in_optimizer"] == value["trainable"], value
    if strategy == "FULL_SHARD":  # the saved full state dict reloads strictly, ties included
        assert not value["reload_missing"] and not value["reload_unexpected"], value
        assert value["reload_compared"] == value["reload_keys"] > 0, value
        assert value["reload_diff"] == 0.0 and value["reload_ties_kept"], value


@pytest.mark.parametrize("model", [name for name in MODELS if name != "lora"])
def test_merge_weights_output_loads_with_from_pretrained(tmp_path_factory, model: str) -> None:
    value = entry(matrix("two", tmp_path_factory), f"{model}/merge_weights")
    assert not value["reload_missing"] and not value["reload_unexpected"], value
    assert value["reload_compared"] == value["reload_keys"] > 0 and value["reload_diff"] == 0.0, value
    assert value["reload_ties_kept"], value


def test_lora_trains_only_adapters(tmp_path_factory) -> None:
    if "lora" not in MODELS:
        pytest.skip("peft is not installed (pip install trainkit[dev])")
    value = entry(matrix("two", tmp_path_factory), "lora/TRANSFORMER_BASED_WRAP/FULL_SHARD")
    assert value["trainable"] == value["trainable_in_optimizer"] == 8  # lora_A/B of q_proj, v_proj, 2 layers


def test_mixed_dtypes_are_unified_before_sharding(tmp_path_factory) -> None:
    value = entry(matrix("two", tmp_path_factory), "mixed_dtypes")
    assert value["dtypes"] == ["torch.float32"] and value["loss_diff"] <= LOSS_TOLERANCE, value


def test_meta_loading_keeps_ties(tmp_path_factory) -> None:
    value = entry(matrix("two", tmp_path_factory), "meta_loading_tied")
    assert value["ties_kept"] == 1.0 and value["loss_diff"] <= LOSS_TOLERANCE, value


@pytest.mark.parametrize("mode", ["one", "two"])
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_save_then_load_in_one_process(tmp_path_factory, mode: str, state_dict_type: str) -> None:
    value = entry(matrix(mode, tmp_path_factory), f"save_load/{state_dict_type}")
    assert value["keys_equal"] and value["diff"] == 0.0, value
    assert value["ties_kept"] and value["loss_after_load_finite"], value


def test_local_state_dict_is_refused_clearly(tmp_path_factory) -> None:
    value = matrix("one", tmp_path_factory)["save_load/LOCAL_STATE_DICT"]
    assert value["refused"] == "ConfigError" and "SHARDED_STATE_DICT" in value["message"], value
