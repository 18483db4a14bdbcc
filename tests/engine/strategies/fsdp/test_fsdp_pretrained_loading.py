"""``cpu_ram_efficient_loading`` with ``from_pretrained``: only rank 0 reads weights, every rank ends up with them.

CPU only. The unit tests run in this process (rank numbers come from the environment); the three
launches run the worker on 2 gloo ranks: under ``trainkit launch`` (model loaded before ``Accelerator()``),
after ``Accelerator(deepspeed_plugin=...)`` with ``zero3_init_flag``, and through ``TrainingArguments`` +
``Trainer``. Peak memory is measured by
``benchmarks/fsdp_loading_memory.py``, not here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from tests.distributed import ENGINE_WORKERS, REPO, free_port, run_torchrun, worker_env
from trainkit.engine.strategies.fsdp import pretrained_loading
from trainkit.engine.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

WORKER = ENGINE_WORKERS / "fsdp_pretrained_loading.py"
LAUNCH_YAML = """\
distributed_type: FSDP
num_processes: 2
use_cpu: true
mixed_precision: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
  fsdp_state_dict_type: FULL_STATE_DICT
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied GPT-2 saved in fp32; 1001 vocabulary rows shard unevenly over 2 ranks."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1001, n_positions=32, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch):
    """Pretend to be a rank of a 2-process job; undo any patch afterwards."""
    def become(number: int) -> None:
        monkeypatch.setenv("RANK", str(number))
        monkeypatch.setenv("WORLD_SIZE", "2")
    for name in pretrained_loading.TRANSFORMERS_FLAGS:
        monkeypatch.delenv(name, raising=False)
    yield become
    pretrained_loading.restore_from_pretrained()


def test_other_ranks_build_on_meta_until_restored(rank, checkpoint: Path) -> None:
    rank(1)
    assert pretrained_loading.load_on_rank0_only()
    model = GPT2LMHeadModel.from_pretrained(checkpoint, dtype=torch.bfloat16)
    assert all(p.is_meta for p in model.parameters()) and model.lm_head.weight is model.transformer.wte.weight
    # The caller's device_map wins: the call goes to transformers as written (which needs Accelerate for it).
    if importlib.util.find_spec("accelerate") is not None:
        explicit = GPT2LMHeadModel.from_pretrained(checkpoint, device_map="cpu")
        assert not any(p.is_meta for p in explicit.parameters())
    else:
        with pytest.raises(ValueError, match="accelerate"):
            GPT2LMHeadModel.from_pretrained(checkpoint, device_map="cpu")
    pretrained_loading.restore_from_pretrained()
    assert not any(p.is_meta for p in GPT2LMHeadModel.from_pretrained(checkpoint).parameters())


def test_other_ranks_keep_configuration_keywords_and_need_no_accelerate(rank, checkpoint: Path) -> None:
    """Built from the configuration ``from_pretrained`` would use (keywords and an explicit config included),
    without ``device_map="meta"``, which transformers only takes with the ``accelerate`` package installed."""
    from transformers import AutoModelForSequenceClassification, GPT2Config

    rank(1)
    pretrained_loading.load_on_rank0_only()
    classifier = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=3, dtype="auto")
    assert all(p.is_meta for p in classifier.parameters()) and classifier.score.out_features == 3
    assert not classifier.training  # as from_pretrained returns models
    configured = GPT2LMHeadModel.from_pretrained(checkpoint, config=GPT2Config.from_pretrained(checkpoint, n_layer=1))
    assert all(p.is_meta for p in configured.parameters()) and len(configured.transformer.h) == 1


def test_restoring_unsets_transformers_flags(rank) -> None:
    """Left set, the flags make transformers zero the weights of later loads on ranks other than 0."""
    import os

    rank(1)
    pretrained_loading.load_on_rank0_only()
    pretrained_loading.restore_from_pretrained()
    assert not any(name in os.environ for name in pretrained_loading.TRANSFORMERS_FLAGS)


def test_rank0_loads_normally_and_transformers_is_told(rank, checkpoint: Path) -> None:
    import os

    rank(0)
    assert not pretrained_loading.load_on_rank0_only()
    assert all(os.environ[name] == value for name, value in pretrained_loading.TRANSFORMERS_FLAGS.items())
    assert not any(p.is_meta for p in GPT2LMHeadModel.from_pretrained(checkpoint).parameters())


def test_the_plugin_switches_loading_on(rank, checkpoint: Path) -> None:
    rank(1)
    FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    assert all(p.is_meta for p in GPT2LMHeadModel.from_pretrained(checkpoint).parameters())


@pytest.mark.multiprocess
def test_launcher_config_applies_before_the_script_loads(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "fsdp.yaml").write_text(LAUNCH_YAML)
    env = worker_env(device="cpu")
    command = [sys.executable, "-m", "trainkit.cli.main", "launch", "--config_file", str(tmp_path / "fsdp.yaml"),
               "--main_process_port", str(free_port()), str(WORKER), "launch", str(checkpoint), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    entry = json.loads((tmp_path / "pretrained_launch.json").read_text())
    assert entry["fsdp_loading"] and entry["built_on_meta"] == [0.0, 1.0]  # rank 1 read no weights
    assert entry["state_diff"] == 0.0 and entry["tied"] == [1.0, 1.0]  # bf16 weights exactly, tie kept
    assert entry["loss_diff"] == 0.0  # sharded forward == the checkpoint loaded plainly
    assert entry["reference_real"] == [1.0, 1.0]  # after prepare, from_pretrained is normal again


@pytest.mark.multiprocess
def test_accelerator_with_deepspeed_zero3_init_flag_applies_before_the_script_loads(checkpoint: Path,
                                                                                   tmp_path: Path) -> None:
    run_torchrun(WORKER, "deepspeed", str(checkpoint), str(tmp_path), nproc=2, timeout=240,
                 env=worker_env(device="cpu"))
    entry = json.loads((tmp_path / "pretrained_deepspeed.json").read_text())
    assert entry["fsdp_loading"] and entry["built_on_meta"] == [0.0, 1.0]
    assert entry["state_diff"] == 0.0 and entry["tied"] == [1.0, 1.0] and entry["loss_diff"] == 0.0


@pytest.mark.multiprocess
def test_trainer_arguments_apply_before_the_script_loads(checkpoint: Path, tmp_path: Path) -> None:
    run_torchrun(WORKER, "trainer", str(checkpoint), str(tmp_path), nproc=2, timeout=240, env=worker_env(device="cpu"))
    entry = json.loads((tmp_path / "pretrained_trainer.json").read_text())
    assert entry["built_on_meta"] == [0.0, 1.0]
    assert len(entry["losses"]) == 3 and entry["losses"] == entry["reference_losses"]  # same as every rank loading


def test_deepspeed_zero3_init_flag_in_training_arguments(rank, checkpoint: Path, tmp_path: Path) -> None:
    from trainkit import TrainingArguments

    rank(1)
    TrainingArguments(output_dir=str(tmp_path), report_to=[],
                      deepspeed={"zero_optimization": {"stage": 3, "zero3_init_flag": True}})
    assert all(p.is_meta for p in GPT2LMHeadModel.from_pretrained(checkpoint).parameters())
