"""Every ``Accelerator(...)`` keyword acts, or says it does not (CPU, one process).

``PROOFS`` holds one proof per keyword of ``Accelerator.__init__``; a keyword without one fails
``test_every_keyword_has_a_proof``. A proof is a check on what the keyword configures, an error naming what it
needs, one warning line naming it, or a reference to a test that already proves it (which must exist).
"""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.utils.dataclasses import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProjectConfiguration,
)
from trainkit.utils import TorchDynamoPlugin

TESTS = Path(__file__).resolve().parents[1]


def p_mixed_precision(tmp_path):
    assert Accelerator(cpu=True, mixed_precision="bf16").mixed_precision == "bf16"


def p_accumulation(tmp_path):
    assert Accelerator(cpu=True, gradient_accumulation_steps=4).gradient_accumulation_steps == 4
    plugin = GradientAccumulationPlugin(num_steps=3)
    assert Accelerator(cpu=True, gradient_accumulation_plugin=plugin).gradient_accumulation_steps == 3


def p_cpu(tmp_path):
    accelerator = Accelerator(cpu=True)
    assert accelerator.device.type == "cpu" and accelerator.config.use_cpu


def p_dataloader_config(tmp_path):
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False, split_batches=True))
    assert (accelerator.even_batches, accelerator.split_batches) == (False, True)
    assert Accelerator(cpu=True, even_batches=False, split_batches=True).even_batches is False
    assert Accelerator(cpu=True, split_batches=True).split_batches is True


def p_log_with(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    accelerator.log({"loss": 1.0}, step=1)
    accelerator.end_training()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"loss": 1.0') == 1


def p_project(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path / "p"), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    assert accelerator.project_configuration is config
    assert Accelerator(cpu=True, project_dir=str(tmp_path / "q")).project_dir == str(tmp_path / "q")
    accelerator.prepare(nn.Linear(2, 2))
    accelerator.save_state()
    assert (tmp_path / "p" / "checkpoints" / "checkpoint_0").is_dir()


def p_step_scheduler(tmp_path):
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
    _, _, prepared = accelerator.prepare(model, optimizer, scheduler)
    assert prepared.step_with_optimizer is False


def p_kwargs_handlers(tmp_path):
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=64.0)])
    assert accelerator.scaler.get_scale() == 64.0


def p_device_placement(tmp_path):
    accelerator = Accelerator(cpu=True, device_placement=False)
    assert accelerator.device_placement is False


def p_dynamo(tmp_path):
    assert str(Accelerator(cpu=True, dynamo_backend="eager").dynamo_plugin.backend).lower().endswith("eager")
    plugin = TorchDynamoPlugin(backend="eager", mode="default")
    assert Accelerator(cpu=True, dynamo_plugin=plugin).dynamo_plugin.mode == "default"


def p_parallelism(tmp_path):
    """torch_tp_plugin, parallelism_config and deepspeed_plugins: refused by name, with the reason."""
    for keyword, words in (("torch_tp_plugin", "torch_tp_plugin"), ("parallelism_config", "parallelism_config"),
                           ("deepspeed_plugins", "one DeepSpeed config")):
        with pytest.raises(NotImplementedError, match=words):
            Accelerator(cpu=True, **{keyword: object()})


def p_megatron(tmp_path):
    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        Accelerator(cpu=True, megatron_lm_plugin=object())


def p_rng_types(tmp_path, caplog=None):
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        Accelerator(cpu=True, rng_types=["generator"])
    assert "rng_types" in caplog.text and "no effect" in caplog.text


def p_engine_config(tmp_path):
    from trainkit.engine.api.configuration import resolve_for_accelerator

    config = resolve_for_accelerator(cpu=True, mixed_precision="bf16")
    accelerator = Accelerator(engine_config=config)
    assert accelerator.config is config and accelerator.mixed_precision == "bf16"


PROOFS: dict[str, Any] = {
    "mixed_precision": p_mixed_precision, "gradient_accumulation_steps": p_accumulation, "cpu": p_cpu,
    "fsdp_plugin": "engine/strategies/fsdp/test_fsdp_processes.py::test_strategy_matches_ddp",
    "dataloader_config": p_dataloader_config, "log_with": p_log_with, "project_dir": p_project,
    "project_config": p_project, "step_scheduler_with_optimizer": p_step_scheduler,
    "kwargs_handlers": p_kwargs_handlers, "device_placement": p_device_placement,
    "split_batches": p_dataloader_config, "even_batches": p_dataloader_config, "dynamo_backend": p_dynamo,
    "dynamo_plugin": p_dynamo, "deepspeed_plugin": "engine/strategies/test_deepspeed_processes.py::test_each_stage_trains_like_ddp",
    "megatron_lm_plugin": p_megatron, "gradient_accumulation_plugin": p_accumulation, "rng_types": p_rng_types,
    "engine_config": p_engine_config, "torch_tp_plugin": p_parallelism, "parallelism_config": p_parallelism,
    "deepspeed_plugins": p_parallelism,
}


def test_every_keyword_has_a_proof():
    keywords = [name for name in inspect.signature(Accelerator.__init__).parameters if name != "self"]
    assert sorted(set(keywords) - set(PROOFS)) == [], "an Accelerator keyword without a proof of its effect"
    assert sorted(set(PROOFS) - set(keywords)) == []


@pytest.mark.parametrize("name", sorted(PROOFS))
def test_the_keyword_acts_or_says_why_not(name, tmp_path, caplog):
    proof = PROOFS[name]
    if isinstance(proof, str):
        path, test = proof.split("::")
        assert re.search(rf"^def {re.escape(test)}\(", (TESTS / path).read_text(), re.MULTILINE), proof
    elif "caplog" in inspect.signature(proof).parameters:
        proof(tmp_path, caplog=caplog)
    else:
        proof(tmp_path)
