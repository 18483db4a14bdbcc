"""Every ``Accelerator(...)`` keyword acts, or says why it cannot (CPU; the data and sharding keywords on 2 gloo ranks).

``PROOFS`` holds one proof per keyword of ``Accelerator.__init__`` (kinds in tests/proofs.py); a keyword without one
fails ``test_every_keyword_has_a_proof``. A proof sets a non-default value and observes the effect from outside the
engine (the dtype a layer computed in, the steps torch's optimizer took, gradients, files, the batches and parameters
a process holds), so it fails when trainkit ignores the keyword: ``python -m pytest tests/ignore_each_field.py``
checks that (TRAINKIT_IGNORE_FIELD=Accelerator.<keyword>).
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests.distributed import ENGINE_WORKERS, run_torchrun
from tests.proofs import OnGPU, Refuses, Warns, case, run_proof
from tests.trainer.field_proofs.common import calls_of, ignore_mode_key, optimizer_steps
from trainkit import Accelerator
from trainkit.utils import TorchDynamoPlugin
from trainkit.utils.dataclasses import GradientAccumulationPlugin, GradScalerKwargs, ProjectConfiguration

pytestmark = pytest.mark.timeout(300)


def build_accelerator(**keywords) -> Accelerator:
    return Accelerator(cpu=True, **keywords)


def layer_dtype(accelerator: Accelerator) -> torch.dtype:
    """The dtype the inner layer of a prepared model computes in (the prepared forward returns fp32 outputs)."""
    inner = nn.Linear(2, 2)
    seen: list[torch.dtype] = []
    inner.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    accelerator.prepare(nn.Sequential(inner))(torch.ones(1, 2))
    return seen[0]


def p_mixed_precision(tmp_path):
    assert layer_dtype(Accelerator(cpu=True, mixed_precision="bf16")) == torch.bfloat16  # default: float32


def p_engine_config(tmp_path):
    from trainkit.engine.accelerator_parts.configuration import resolve_for_accelerator

    assert layer_dtype(Accelerator(engine_config=resolve_for_accelerator(cpu=True, mixed_precision="bf16"))) == torch.bfloat16


def optimizer_steps_in_4_micro_batches(accelerator: Accelerator, step_scheduler: bool = False):
    """4 micro-batches under accumulate(); returns (torch optimizer steps taken, the scheduler's last rate)."""
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    with optimizer_steps() as steps:
        for _ in range(4):
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.ones(1, 2)).sum())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return len(steps), scheduler.get_last_lr()[0]


def p_gradient_accumulation_steps(tmp_path):
    assert optimizer_steps_in_4_micro_batches(Accelerator(cpu=True, gradient_accumulation_steps=2))[0] == 2


def p_gradient_accumulation_plugin(tmp_path):
    plugin = GradientAccumulationPlugin(num_steps=2)
    assert optimizer_steps_in_4_micro_batches(Accelerator(cpu=True, gradient_accumulation_plugin=plugin))[0] == 2


def p_step_scheduler_with_optimizer(tmp_path):
    """False: the scheduler steps at every call, 4 halvings (default: only with the optimizer's 2 steps)."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    assert optimizer_steps_in_4_micro_batches(accelerator)[1] == 0.5 ** 4


def p_kwargs_handlers(tmp_path):
    """GradScalerKwargs(init_scale=64): the fp16 loss is scaled by 64 before backward (default 2**16)."""
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=64.0)])
    model = nn.Linear(2, 1)
    prepared, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(prepared(torch.ones(1, 2)).float().sum())
    assert torch.equal(model.weight.grad, torch.full((1, 2), 64.0))  # d(sum)/dw = 1 per input of 1, times the scale


def p_log_with(tmp_path):
    pytest.importorskip("tensorboard", reason="log_with='tensorboard' needs the optional tensorboard package")
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    accelerator.log({"loss": 1.0}, step=1)
    accelerator.end_training()
    assert list(tmp_path.rglob("events.out.tfevents*"))  # without log_with: no tracker, no file


def p_project_dir(tmp_path):
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path / "project"), log_with="jsonl")
    accelerator.init_trackers("run")
    accelerator.log({"loss": 1.0}, step=1)
    accelerator.end_training()
    log = tmp_path / "project" / "run" / "metrics.jsonl"
    assert log.is_file() and log.read_text().count('"loss": 1.0') == 1


def p_project_config(tmp_path):
    """automatic_checkpoint_naming: save_state() with no folder writes project_dir/checkpoints/checkpoint_0."""
    config = ProjectConfiguration(project_dir=str(tmp_path / "p"), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(nn.Linear(2, 2))
    accelerator.save_state()
    assert (tmp_path / "p" / "checkpoints" / "checkpoint_0").is_dir()


def compile_calls(monkeypatch, **keywords) -> list[dict]:
    """What torch.compile was called with when a model was prepared (recorded, not compiled)."""
    calls: list[dict] = []

    def recording_compile(model=None, **kwargs):
        calls.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", recording_compile)
    Accelerator(cpu=True, **keywords).prepare(nn.Linear(2, 2))
    return calls


def p_dynamo_backend(tmp_path, monkeypatch):
    assert [call.get("backend") for call in compile_calls(monkeypatch, dynamo_backend="aot_eager")] == ["aot_eager"]


def p_dynamo_plugin(tmp_path, monkeypatch):
    plugin = TorchDynamoPlugin(backend="eager", mode="max-autotune-no-cudagraphs")
    calls = compile_calls(monkeypatch, dynamo_plugin=plugin)
    assert [(call.get("backend"), call.get("mode")) for call in calls] == [("eager", "max-autotune-no-cudagraphs")]


def p_torch_tp_plugin(tmp_path):
    """Accelerate's deprecated spelling of ParallelismConfig(tp_size=...): its degree is checked against the run
    (1 process here), with Accelerate's FutureWarning (the 2-rank effect: engine/strategies/test_nd_parallel_*)."""
    with pytest.warns(FutureWarning, match="parallelism_config=ParallelismConfig"), \
            pytest.raises(ValueError, match="tp_size=2 = 2 processes, but the run has 1"):
        Accelerator(cpu=True, torch_tp_plugin=SimpleNamespace(tp_size=2))


def p_device_placement(tmp_path):
    """GPU: device_placement=False leaves a prepared model where it is (default: moved to the GPU)."""
    model = nn.Linear(2, 2)
    Accelerator(device_placement=False).prepare(model)
    assert model.weight.device.type == "cpu"


def p_cpu(tmp_path):
    """GPU: cpu=True runs on the CPU where the GPU would be chosen."""
    model = nn.Linear(2, 2)
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(model)
    assert model.weight.device.type == "cpu" and accelerator.prepare(torch.ones(1)).device.type == "cpu"


@functools.cache
def _two_ranks(ignored: str, folder: str) -> list[dict]:
    run_torchrun(ENGINE_WORKERS / "keyword_effects.py", folder, nproc=2, timeout=240)
    return [json.loads((Path(folder) / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def two_ranks(tmp_path_factory) -> list[dict]:
    """Each rank's facts from workers/keyword_effects.py (one launch per pytest process and ignored keyword)."""
    return _two_ranks(ignore_mode_key(), str(tmp_path_factory.getbasetemp()))


def p_split_batches(tmp_path_factory):
    ranks = two_ranks(tmp_path_factory)
    assert [facts["split_batches"] for facts in ranks] == [[2, 2, 2, 2]] * 2  # each rank half of a batch of 4


def p_dataloader_config(tmp_path_factory):
    ranks = two_ranks(tmp_path_factory)
    assert [facts["dataloader_config"] for facts in ranks] == [[2, 2, 2, 2]] * 2  # DataLoaderConfiguration(split_batches=True)


def p_even_batches(tmp_path_factory):
    ranks = two_ranks(tmp_path_factory)
    assert ranks[1]["even_batches"] == [4, 1]  # 13 samples: rank 1's last batch not padded (default: [4, 4])


def sharded(tmp_path_factory, keyword: str) -> bool:
    parts = [facts[keyword] for facts in two_ranks(tmp_path_factory)]
    return all(part == {"all_dtensor": True, "local_fraction": 0.5} for part in parts)  # default: whole on each


def p_fsdp_plugin(tmp_path_factory):
    assert sharded(tmp_path_factory, "fsdp_plugin")


def p_parallelism_config(tmp_path_factory):
    assert sharded(tmp_path_factory, "parallelism_config")


def p_deepspeed_plugin(tmp_path_factory):
    assert sharded(tmp_path_factory, "deepspeed_plugin")  # ZeRO-3 runs on FSDP2


CUDA_ONLY = "the CPU is the only device on a machine without CUDA"
PROOFS: dict[str, Any] = {
    "device_placement": OnGPU(p_device_placement, CUDA_ONLY), "split_batches": p_split_batches,
    "mixed_precision": p_mixed_precision, "gradient_accumulation_steps": p_gradient_accumulation_steps,
    "cpu": OnGPU(p_cpu, CUDA_ONLY), "dataloader_config": p_dataloader_config, "deepspeed_plugin": p_deepspeed_plugin,
    "fsdp_plugin": p_fsdp_plugin, "torch_tp_plugin": p_torch_tp_plugin,
    "megatron_lm_plugin": Refuses(dict(megatron_lm_plugin=object()), "Megatron-LM"),
    "rng_types": Warns(dict(rng_types=["generator"]), "rng_types=['generator']): no effect", once=False), "log_with": p_log_with,
    "project_dir": p_project_dir, "project_config": p_project_config,
    "gradient_accumulation_plugin": p_gradient_accumulation_plugin,
    "step_scheduler_with_optimizer": p_step_scheduler_with_optimizer, "kwargs_handlers": p_kwargs_handlers,
    "dynamo_backend": p_dynamo_backend, "dynamo_plugin": p_dynamo_plugin,
    "deepspeed_plugins": Refuses(dict(deepspeed_plugins=object()), "one DeepSpeed config"),
    "parallelism_config": p_parallelism_config, "even_batches": p_even_batches, "engine_config": p_engine_config,
}
IN_PROCESSES = {"split_batches", "dataloader_config", "even_batches", "fsdp_plugin", "parallelism_config",
                "deepspeed_plugin"}


def keyword_cases() -> list:
    return [case(name, proof, *([pytest.mark.multiprocess] if name in IN_PROCESSES else []))
            for name, proof in PROOFS.items()]


def test_every_keyword_has_a_proof():
    keywords = [name for name in inspect.signature(Accelerator.__init__).parameters if name != "self"]
    assert sorted(set(keywords) - set(PROOFS)) == [], "an Accelerator keyword without a proof of its effect"
    assert sorted(set(PROOFS) - set(keywords)) == []


@pytest.mark.parametrize("name, proof", keyword_cases())
def test_the_keyword_acts_or_says_why_not(name, proof, request):
    run_proof(proof, request, build_accelerator)
