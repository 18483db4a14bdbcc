"""Device alignment and offload at run time (trainkit.hooks' AlignDevicesHook, trainkit.big_modeling's
cpu_offload / disk_offload / dispatch_model, trainkit.utils' align_module_device & co., Accelerate's API).

Weights live on ``meta`` between forwards and come back equal for each forward; outputs equal the plain
model's. Only the CPU and ``meta`` devices are used (no accelerator needed): device maps name "cpu" and "disk",
and ``meta`` stands for "another device" where inputs must follow the weights. In-process."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from trainkit.big_modeling import cpu_offload, disk_offload, dispatch_model
from trainkit.hooks import (AlignDevicesHook, add_hook_to_module, attach_align_device_hook,
                            attach_execution_device_hook, remove_hook_from_module, remove_hook_from_submodules)
from trainkit.utils import align_module_device, get_state_dict_offloaded_model, has_offloaded_params

from tests.engine.inference.nets import Net


class ReadsChildWeights(nn.Module):
    """Uses its child's weights without calling the child (what preload_module_classes is for)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return x @ self.inner.weight.t() + self.inner.bias


def _net() -> Net:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.norm.running_mean.uniform_()  # buffers that differ from their defaults, so losing them shows
        net.norm.running_var.uniform_(1.0, 2.0)
    return net


def _on_meta(module: nn.Module) -> bool:
    return all(p.device.type == "meta" for p in module.parameters(recurse=False))


def test_offload_hook_keeps_weights_on_meta_and_loads_them_per_forward():
    net, x = _net(), torch.randn(2, 3)
    expected, saved = net(x), {k: v.clone() for k, v in net.state_dict().items()}
    for module in (net.linear1, net.norm, net.linear2):
        add_hook_to_module(module, AlignDevicesHook(execution_device="cpu", offload=True))
    assert all(_on_meta(m) for m in (net.linear1, net.norm, net.linear2))
    assert net.norm.running_mean.device.type == "cpu"  # buffers stay on the execution device by default
    torch.testing.assert_close(net(x), expected)
    assert _on_meta(net.linear1)  # offloaded again after the forward
    assert has_offloaded_params(net.linear1) and not has_offloaded_params(net)
    for module in (net.linear1, net.norm, net.linear2):
        remove_hook_from_module(module)
    for name, tensor in net.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_offloaded_buffers_and_preloaded_modules():
    torch.manual_seed(0)
    model = nn.Sequential(ReadsChildWeights(), nn.BatchNorm1d(3)).eval()
    x = torch.randn(2, 3)
    expected = model(x)
    attach_align_device_hook(model, execution_device="cpu", offload=True, offload_buffers=True,
                             weights_map=dict(model.state_dict()), preload_module_classes=["ReadsChildWeights"])
    assert model[1].running_mean.device.type == "meta"
    assert has_offloaded_params(model[0]) and not hasattr(model[0].inner, "_hf_hook")  # one hook for the whole block
    torch.testing.assert_close(model(x), expected)


def test_execution_device_hook_moves_inputs_to_the_weights_device():
    net = _net()
    attach_execution_device_hook(net, "meta")
    add_hook_to_module(net, AlignDevicesHook(execution_device="meta", place_submodules=True), append=True)
    assert all(p.device.type == "meta" for p in net.parameters())
    output = net(torch.randn(2, 3))  # a CPU input reaches meta weights
    assert output.device.type == "meta" and output.shape == (2, 5)


def test_io_same_device_returns_output_where_the_input_was():
    net = _net()
    hook = AlignDevicesHook(execution_device="cpu", io_same_device=True)
    add_hook_to_module(net, hook)
    assert net(torch.randn(2, 3)).device.type == "cpu" and hook.input_device == torch.device("cpu")


def test_cpu_offload_matches_the_plain_model_and_is_removable():
    net, x = _net(), torch.randn(2, 3)
    expected, saved = net(x), {k: v.clone() for k, v in net.state_dict().items()}
    for offload_buffers in (False, True):
        cpu_offload(net, execution_device="cpu", offload_buffers=offload_buffers)
        assert all(p.device.type == "meta" for p in net.parameters())
        assert (net.norm.running_mean.device.type == "meta") == offload_buffers
        torch.testing.assert_close(net(x), expected)
        assert get_state_dict_offloaded_model(net).keys() == saved.keys()
        for name, tensor in get_state_dict_offloaded_model(net).items():
            assert torch.equal(tensor, saved[name]), name
        remove_hook_from_submodules(net)
        assert all(p.device.type == "cpu" for p in net.parameters())


def test_align_module_device_loads_one_module_for_the_block():
    net = _net()
    weight = net.linear1.weight.detach().clone()
    cpu_offload(net, execution_device="cpu")
    with align_module_device(net.linear1):
        assert torch.equal(net.linear1.weight, weight) and _on_meta(net.linear2)
    assert _on_meta(net.linear1)
    with align_module_device(net.linear1, "cpu"):
        assert net.linear1.weight.device.type == "cpu"
    assert net.linear1._hf_hook.execution_device == "cpu"
    plain = nn.Linear(2, 2)
    with align_module_device(plain):  # nothing to load, no device asked: nothing moves
        assert plain.weight.device.type == "cpu"


def test_disk_offload_writes_an_index_and_reads_weights_from_it(tmp_path):
    net, x = _net(), torch.randn(2, 3)
    expected = net(x)
    disk_offload(net, tmp_path, execution_device="cpu")
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == set(net.state_dict()) and (tmp_path / "linear1.weight.dat").is_file()
    assert all(p.device.type == "meta" for p in net.parameters())
    torch.testing.assert_close(net(x), expected)


def test_disk_offload_uses_an_existing_folder_as_is(tmp_path):
    source, x = _net(), torch.randn(2, 3)
    with torch.no_grad():
        source.linear2.bias.add_(5.0)
    from trainkit.utils import offload_state_dict

    offload_state_dict(tmp_path, source.state_dict())
    other = _net()
    disk_offload(other, tmp_path, execution_device="cpu")  # the folder's weights win over the model's own
    torch.testing.assert_close(other(x), source(x))


@pytest.mark.parametrize("device_map", [
    {"linear1": "cpu", "norm": "disk", "linear2": "cpu"},
    {"linear1": "disk", "norm": "disk", "linear2": "disk"},
    {"linear1": "meta", "norm": "cpu", "linear2": "disk"},
], ids=["cpu-and-disk", "disk-only", "meta-cpu-disk"])
def test_dispatch_model_places_each_block_as_the_map_says(tmp_path, device_map):
    net, x = _net(), torch.randn(2, 3)
    expected = net(x)
    dispatch_model(net, device_map, offload_dir=tmp_path, main_device="cpu")
    assert net.hf_device_map == device_map
    on_disk = {name for name, device in device_map.items() if device == "disk"}
    assert {key.split(".")[0] for key in json.loads((tmp_path / "index.json").read_text())} == on_disk
    for name, device in device_map.items():
        module = getattr(net, name)
        if device == "disk":
            assert _on_meta(module)
        elif device == "cpu":
            assert module.weight.device.type == "cpu"
    if "meta" in device_map.values():
        assert net.linear1.weight.device.type == "meta"
        return  # a meta block computes no values; placement is what it shows
    torch.testing.assert_close(net(x), expected)


def test_dispatch_model_refuses_incomplete_maps_missing_folders_and_moves():
    net = _net()
    with pytest.raises(ValueError, match="norm"):
        dispatch_model(net, {"linear1": "cpu", "linear2": "cpu"})
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(net, {"linear1": "cpu", "norm": "cpu", "linear2": "disk"})


def test_dispatched_model_with_offloaded_weights_cannot_be_moved(tmp_path):
    net = dispatch_model(_net(), {"linear1": "cpu", "norm": "cpu", "linear2": "disk"}, offload_dir=tmp_path)
    with pytest.raises(RuntimeError, match="offloaded"):
        net.to("cpu")
    remove_hook_from_submodules(net)
    assert "to" not in net.__dict__


def test_dispatch_model_on_one_device_moves_the_model_without_hooks():
    net = dispatch_model(_net(), {"": "cpu"})
    assert net.hf_device_map == {"": "cpu"} and not any(hasattr(m, "_hf_hook") for m in net.modules())


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_dispatch_model_keeps_tied_weights_tied(tmp_path):
    torch.manual_seed(0)
    model, x = Tied(), torch.randn(2, 4)
    expected = model(x)
    dispatch_model(model, {"first": "disk", "second": "cpu"}, offload_dir=tmp_path, main_device="cpu")
    assert model.first.weight is model.second.weight  # retied to the copy that is not offloaded
    torch.testing.assert_close(model(x), expected)


def test_tied_weight_loaded_for_one_forward_is_dropped_from_the_tied_map_after_it():
    torch.manual_seed(0)
    model, x = Tied(), torch.randn(2, 4)
    expected = model(x)
    tied_map: dict = {model.first.weight.data_ptr(): {}}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=dict(model.state_dict()),
                             tied_params_map=tied_map)
    torch.testing.assert_close(model(x), expected)
    assert tied_map == {model.first._hf_hook.weights_map["weight"].data_ptr(): {}}


def test_set_module_tensor_to_device_reuses_a_tied_weight_through_the_map():
    from trainkit.utils import set_module_tensor_to_device

    model = Tied()
    weight = model.first.weight
    tied_map: dict = {weight.data_ptr(): {}}
    set_module_tensor_to_device(model, "first.weight", "cpu", value=weight, tied_params_map=tied_map)
    model.second.weight = nn.Parameter(weight.detach().clone())  # untied; the map ties it back
    set_module_tensor_to_device(model, "second.weight", "cpu", value=weight, tied_params_map=tied_map)
    assert model.first.weight is model.second.weight is tied_map[weight.data_ptr()]["cpu"]


def test_dispatch_model_reads_a_torch_device_main_device_like_its_string(tmp_path):
    net, x = _net(), torch.randn(2, 3)
    expected = net(x)
    dispatch_model(net, {"linear1": "cpu", "norm": "cpu", "linear2": "disk"}, main_device=torch.device("cpu"),
                   offload_dir=tmp_path)
    assert net.linear1.weight.device.type == "cpu"  # a "cpu" block on a CPU main device is not offloaded
    torch.testing.assert_close(net(x), expected)
