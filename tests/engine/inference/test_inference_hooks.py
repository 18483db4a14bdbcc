"""Module hooks around forward (trainkit.hooks, Accelerate's accelerate.hooks API): attaching, chaining,
replacing and removing them, the forward's name and signature kept, no_grad, copies, torch.fx graphs, and
layerwise casting (storage dtype at rest, compute dtype during forward). CPU only, in-process."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

from trainkit.big_modeling import attach_layerwise_casting_hooks, cpu_offload_with_hook
from trainkit.hooks import (LayerwiseCastingHook, ModelHook, SequentialHook, UserCpuOffloadHook, add_hook_to_module,
                            remove_hook_from_module, remove_hook_from_submodules)
from trainkit.utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

from tests.engine.inference.nets import Net


class AddToInput(ModelHook):
    def __init__(self, amount: float) -> None:
        self.amount = amount

    def pre_forward(self, module, *args, **kwargs):
        return (args[0] + self.amount,) + args[1:], kwargs


class DoubleScale(ModelHook):
    def pre_forward(self, module, *args, **kwargs):
        return args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 2}


class AddToOutput(ModelHook):
    def post_forward(self, module, output):
        return output + 1


@pytest.fixture
def net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def test_hook_keeps_forward_name_and_signature_and_is_removed(net):
    original = net.forward
    add_hook_to_module(net, ModelHook())
    assert isinstance(net._hf_hook, ModelHook) and net._old_forward == original
    assert net.forward.__name__ == "forward"
    assert list(inspect.signature(net.forward).parameters) == ["x", "scale"]
    remove_hook_from_module(net)
    assert not hasattr(net, "_hf_hook") and not hasattr(net, "_old_forward")
    assert net.forward == original


def test_pre_and_post_forward_change_args_kwargs_and_output(net):
    x = torch.randn(2, 3)
    add_hook_to_module(net, DoubleScale())
    torch.testing.assert_close(net(x), remove_hook_from_module(net)(x, scale=2.0))
    add_hook_to_module(net, AddToOutput())
    torch.testing.assert_close(net(x), remove_hook_from_module(net)(x) + 1)


def test_adding_replaces_and_append_chains_in_order(net):
    x = torch.randn(2, 3)
    plain, expected = net(x), net(x + 1)
    add_hook_to_module(net, AddToInput(1.0))
    add_hook_to_module(net, AddToInput(1.0))  # replaces: still +1
    torch.testing.assert_close(net(x), expected)
    add_hook_to_module(net, AddToOutput(), append=True)
    assert isinstance(net._hf_hook, SequentialHook) and len(net._hf_hook.hooks) == 2
    torch.testing.assert_close(net(x), expected + 1)
    remove_hook_from_module(net)
    torch.testing.assert_close(net(x), plain)


def test_no_grad_hook_runs_forward_without_autograd(net):
    hook = ModelHook()
    add_hook_to_module(net, hook)
    assert net(torch.randn(2, 3)).requires_grad
    hook.no_grad = True
    assert not net(torch.randn(2, 3)).requires_grad


def test_deep_copy_of_hooked_module_uses_its_own_forward(net):
    add_hook_to_module(net.linear1, AddToOutput())
    twin = copy.deepcopy(net)
    assert twin.linear1.forward is not net.linear1.forward
    with torch.no_grad():
        twin.linear1.bias.add_(10.0)  # only the copy changes: its hook must call the copy's own forward
    x = torch.randn(2, 3)
    torch.testing.assert_close(twin.linear1(x), net.linear1(x) + 10.0)


def test_removing_a_hook_from_an_fx_graph_module_keeps_it_recompilable(net):
    graph_module = torch.fx.symbolic_trace(net)
    add_hook_to_module(graph_module, AddToOutput())
    x = torch.randn(2, 3)
    torch.testing.assert_close(graph_module(x), net(x) + 1)
    remove_hook_from_module(graph_module, recurse=True)
    output = next(node for node in graph_module.graph.nodes if node.op == "output")
    with graph_module.graph.inserting_before(output):
        negated = graph_module.graph.call_function(torch.neg, (output.args[0],))
    output.args = (negated,)
    graph_module.recompile()
    torch.testing.assert_close(graph_module(x), -net(x))


def test_remove_hook_from_submodules_reaches_every_level(net):
    for module in (net, net.linear1, net.linear2):
        add_hook_to_module(module, ModelHook())
    remove_hook_from_submodules(net)
    assert not any(hasattr(module, "_hf_hook") for module in net.modules())


class RecordsDtype(nn.Linear):
    seen: list[torch.dtype]

    def forward(self, x):
        self.seen.append(self.weight.dtype)
        return super().forward(x)


def test_layerwise_casting_stores_small_and_computes_large():
    torch.manual_seed(0)
    model = nn.Sequential(RecordsDtype(3, 4), nn.LayerNorm(4), nn.Sequential(RecordsDtype(4, 2)))
    for layer in (model[0], model[2][0]):
        layer.seen = []
    reference = copy.deepcopy(model)
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32,
                                   skip_modules_pattern=("^2",))
    assert model[0].weight.dtype == torch.bfloat16
    assert model[1].weight.dtype == torch.float32  # not a supported layer: left as is
    assert model[2][0].weight.dtype == torch.float32  # skipped by pattern
    x = torch.randn(2, 3)
    with torch.no_grad():
        output = model(x)
    assert model[0].seen == [torch.float32] and model[0].weight.dtype == torch.bfloat16
    assert isinstance(model[0]._hf_hook, LayerwiseCastingHook)
    with torch.no_grad():
        expected = reference[0].to(torch.bfloat16).to(torch.float32)(x)  # the precision the storage dtype keeps
        torch.testing.assert_close(output, reference[2](reference[1](expected)))


def test_layerwise_casting_skips_classes_and_lists_accelerates_layers():
    model = nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 1))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_classes=(nn.Conv1d,))
    assert model[0].weight.dtype == torch.float16 and model[1].weight.dtype == torch.float32
    assert nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING and nn.ConvTranspose3d in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert nn.LayerNorm not in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING


def test_cpu_offload_with_hook_runs_on_the_execution_device_and_offloads_on_request(net):
    x = torch.randn(2, 3)
    expected = net(x)
    model, hook = cpu_offload_with_hook(net, execution_device="cpu")
    assert isinstance(hook, UserCpuOffloadHook) and hook.model is net
    torch.testing.assert_close(model(x), expected)
    second, second_hook = cpu_offload_with_hook(nn.Linear(5, 5), execution_device="cpu", prev_module_hook=hook)
    assert second_hook.hook.prev_module_hook is hook
    assert second(model(x)).shape == (2, 5)
    hook.offload()
    assert net.linear1.weight.device.type == "cpu"
    hook.remove()
    assert not hasattr(net, "_hf_hook")
