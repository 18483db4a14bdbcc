"""Loading checkpoints along a device map (trainkit.utils.modeling's load_checkpoint_in_model, trainkit.big_modeling's
load_checkpoint_and_dispatch) and saving a model dispatched with offloaded weights (Accelerator.save_model):
Accelerate's API.

The maps use "cpu" and "disk" (the devices this machine has); outputs of the loaded, dispatched model equal the
full model's. CPU only, in-process."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trainkit import Accelerator, init_empty_weights
from trainkit.big_modeling import load_checkpoint_and_dispatch
from trainkit.utils.modeling import load_checkpoint_in_model


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.block(self.embed(x))))


def trained_net() -> Net:
    torch.manual_seed(0)
    net = Net()
    net.train()
    net(torch.randn(16, 6))  # the norm's running statistics move away from their initial values
    return net.eval()


def write_sharded_safetensors(state_dict: dict[str, torch.Tensor], folder) -> None:
    """One shard per top-level module and an index, as save_pretrained writes them."""
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state_dict.items():
        shards.setdefault(f"model-{name.split('.')[0]}.safetensors", {})[name] = tensor.clone().contiguous()
    for file, tensors in shards.items():
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
    weight_map = {name: file for file, tensors in shards.items() for name in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_a_sharded_checkpoint_loads_into_a_meta_model_over_cpu_and_disk(tmp_path):
    source = trained_net()
    x = torch.randn(5, 6)
    expected = source(x)
    write_sharded_safetensors(source.state_dict(), tmp_path)
    with init_empty_weights():
        model = Net()
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(model, tmp_path, device_map={"embed": "cpu", "block": "disk", "head": "cpu"},
                                         offload_folder=offload)
    model.eval()
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    # the disk part's weights live in the offload folder, not in the model (meta between forwards)
    assert model.block[0].weight.device.type == "meta" and model.embed.weight.device.type == "cpu"
    index = json.loads((offload / "index.json").read_text())
    assert set(index) == {"block.0.weight", "block.0.bias", "block.1.weight", "block.1.bias", "block.2.weight",
                          "block.2.bias"}  # buffers stay in memory unless offload_buffers
    assert {f for f in os.listdir(offload) if f.endswith(".dat")} == {f"{name}.dat" for name in index}


def test_load_checkpoint_in_model_casts_keeps_fp32_modules_and_parks_cpu_weights(tmp_path):
    source = trained_net()
    torch.save(source.state_dict(), tmp_path / "pytorch_model.bin")
    model = Net()
    before = set(os.listdir(tempfile.gettempdir()))
    load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"}, dtype="float16", keep_in_fp32_modules=["head"],
                             offload_state_dict=True)
    assert model.embed.weight.dtype == torch.float16 and model.head.weight.dtype == torch.float32
    assert model.block[1].num_batches_tracked.dtype == torch.int64  # integers keep their dtype
    torch.testing.assert_close(model.block[1].running_mean, source.block[1].running_mean.half())
    torch.testing.assert_close(model.head.weight, source.head.weight)
    # a checkpoint that does not fit the model fails, naming the tensor; the parked weights' folder is gone either way
    torch.save({**source.state_dict(), "head.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="'head.weight'.*shape"):
        load_checkpoint_in_model(Net(), tmp_path, device_map={"": "cpu"}, offload_state_dict=True)
    assert not [f for f in set(os.listdir(tempfile.gettempdir())) - before if f.startswith("trainkit-state-dict-")]


def test_planned_maps_on_this_machine_and_bad_maps(tmp_path):
    source = trained_net()
    x = torch.randn(5, 6)
    Accelerator().save_model(source, tmp_path)
    # "sequential" within a small CPU budget: the rest goes to disk, and the model still computes the same
    with init_empty_weights():
        model = Net()
    model = load_checkpoint_and_dispatch(model, tmp_path, device_map="sequential", max_memory={"cpu": 700},
                                         offload_folder=tmp_path / "offload")
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    torch.testing.assert_close(model.eval()(x), source(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="'balanced_high_0'"):
        load_checkpoint_and_dispatch(Net(), tmp_path, device_map="balanced_high_0")
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_in_model(Net(), tmp_path, device_map={"embed": "cpu", "block": "disk", "head": "cpu"})
    with pytest.raises(ValueError, match="block.0.weight, block.0.bias"):  # before anything is loaded
        load_checkpoint_in_model(Net(), tmp_path, device_map={"embed": "cpu", "head": "cpu"})
    # no map: loaded in place and returned as is (no hooks)
    model = Net()
    assert load_checkpoint_and_dispatch(model, tmp_path) is model and not hasattr(model, "hf_device_map")
    torch.testing.assert_close(model.eval()(x), source(x), rtol=0, atol=0)


def test_save_model_of_an_offloaded_model_writes_its_full_weights(tmp_path):
    source = trained_net()
    original = {name: tensor.clone() for name, tensor in source.state_dict().items()}
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(source, tmp_path / "full")
    with init_empty_weights():
        model = Net()
    load_checkpoint_and_dispatch(model, tmp_path / "full", device_map={"embed": "cpu", "block": "disk", "head": "disk"},
                                 offload_folder=tmp_path / "offload")
    accelerator.save_model(model, tmp_path / "again")
    saved = load_file(tmp_path / "again" / "model.safetensors")
    assert saved.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(saved[name], tensor), name
