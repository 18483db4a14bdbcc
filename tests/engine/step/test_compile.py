"""torch.compile through the engine (CPU, one process): Accelerate's names, regional compilation, clean keys.

The backend is ``aot_eager``: it runs dynamo and AOTAutograd (graph capture, the backward graph, guards)
without generating C++ kernels, so these checks take seconds on CPU; inductor is the same path plus codegen.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from trainkit import Accelerator
from trainkit.config import ConfigError, LaunchConfig
from trainkit.engine.process.devices import check_processes_fit_gpus
from trainkit.utils import TorchDynamoPlugin


def _bert(layers: int) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=32)
    return BertForSequenceClassification(config)


def _step(model: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (4, 16), generator=generator)
    loss = model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1])).loss
    loss.backward()
    return loss.detach()


def _graphs_for(layers: int, regional: bool) -> tuple[int, torch.Tensor, list[str]]:
    torch._dynamo.reset()
    counters.clear()
    plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=regional)
    model = Accelerator(dynamo_plugin=plugin).prepare(_bert(layers))
    loss = _step(model)
    return counters["stats"]["unique_graphs"], loss, list(model.state_dict())


def test_regional_compilation_compiles_the_block_once_whatever_the_depth():
    shallow, _, _ = _graphs_for(2, regional=True)
    deep, loss, keys = _graphs_for(6, regional=True)
    assert shallow == deep > 0  # one block class, compiled once, reused by every layer
    eager = _step(_bert(6))
    assert torch.allclose(loss, eager, atol=1e-5)
    assert keys == list(_bert(6).state_dict()) and not any("_orig_mod" in key for key in keys)


def test_whole_model_compilation_keeps_the_module_and_its_keys():
    torch._dynamo.reset()
    model = _bert(2)
    prepared = Accelerator(dynamo_backend="aot_eager").prepare(model)
    assert prepared is model and model._compiled_call_impl is not None  # compiled in place, no wrapper
    assert torch.allclose(_step(prepared), _step(_bert(2)), atol=1e-5)
    assert not any("_orig_mod" in key for key in prepared.state_dict())


def test_dynamo_names_follow_accelerate_and_bad_backends_are_named():
    assert TorchDynamoPlugin(backend="INDUCTOR").backend == "inductor"
    assert not TorchDynamoPlugin(backend="NO").enabled and not TorchDynamoPlugin().enabled
    with pytest.raises(ConfigError, match=r"'inducter'.*Did you mean 'inductor'"):
        Accelerator(dynamo_backend="inducter")
    with pytest.raises(ConfigError, match=r"'fastest' for 'dynamo_mode'.*max-autotune"):
        TorchDynamoPlugin(backend="inductor", mode="fastest")


def test_launch_config_reads_dynamo_config_and_the_old_top_level_key():
    config = LaunchConfig.from_mapping({"dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune",
                                                          "dynamo_use_regional_compilation": True}})
    plugin = TorchDynamoPlugin.from_config(config.dynamo_config, where="test")
    assert (plugin.backend, plugin.mode, plugin.use_regional_compilation) == ("inductor", "max-autotune", True)
    assert LaunchConfig.from_mapping({"dynamo_backend": "NO"}).dynamo_config is None  # NO means off
    assert LaunchConfig.from_mapping({"dynamo_backend": "EAGER"}).dynamo_config["dynamo_backend"] == "EAGER"
    with pytest.raises(ConfigError, match=r"'dynamo_use_fulgraph'.*Did you mean 'dynamo_use_fullgraph'"):
        LaunchConfig.from_mapping({"dynamo_config": {"dynamo_use_fulgraph": True}})


def test_more_processes_than_gpus_names_the_counts_and_the_ways_out():
    check_processes_fit_gpus(2, 2, where="here")
    check_processes_fit_gpus(4, 0, where="here")  # no GPU: the processes run on CPU
    with pytest.raises(ConfigError) as error:
        check_processes_fit_gpus(2, 1, where="trainkit launch")
    message = str(error.value)
    assert "2 processes per machine but only 1 GPU visible" in message
    for way_out in ("--num_processes 1", "--cpu", "--gpu_ids"):
        assert way_out in message
