"""set_module_tensor_to_device, get_non_persistent_buffers and compute_module_total_buffer_size (accelerate.utils
names for materialising and inspecting a model's tensors). CPU only (meta and cpu devices)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainkit.utils import (compute_module_total_buffer_size, get_non_persistent_buffers, init_empty_weights,
                            set_module_tensor_to_device)


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def test_materialises_an_empty_model_from_a_state_dict():
    source = _model()
    with init_empty_weights():
        empty = _model()
    assert empty[0].weight.device.type == "meta"
    for name, tensor in source.state_dict().items():
        set_module_tensor_to_device(empty, name, "cpu", value=tensor)
    for name, tensor in source.state_dict().items():
        assert torch.equal(empty.state_dict()[name], tensor), name
    assert isinstance(empty[0].weight, nn.Parameter) and empty[0].weight.requires_grad
    assert "running_mean" in empty[1]._buffers and "running_mean" not in empty[1]._parameters
    x = torch.randn(5, 3)
    assert torch.equal(empty.eval()(x), source.eval()(x))


def test_meta_needs_a_value_and_shapes_must_match():
    model = _model()
    set_module_tensor_to_device(model[0], "weight", "meta")
    assert model[0].weight.device.type == "meta"
    with pytest.raises(ValueError, match="meta device"):
        set_module_tensor_to_device(model, "0.weight", "cpu")
    with pytest.raises(ValueError, match=r"weight: .*shape \(2, 2\).* \(4, 3\)"):  # the name and both shapes
        set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="'nope'"):
        set_module_tensor_to_device(model, "1.nope", "cpu")


def test_dtypes_and_flags_kept():
    model = _model()
    model[0].weight.requires_grad_(False)
    set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.ones(4, 3, dtype=torch.float64))
    assert model[0].weight.dtype == torch.float32 and not model[0].weight.requires_grad
    set_module_tensor_to_device(model, "0.bias", "cpu", value=torch.ones(4), dtype="torch.float16")
    assert model[0].bias.dtype == torch.float16
    set_module_tensor_to_device(model, "1.num_batches_tracked", "cpu", value=torch.tensor(7), dtype=torch.float16)
    assert model[1].num_batches_tracked.dtype == torch.int64 and int(model[1].num_batches_tracked) == 7
    with pytest.raises(NotImplementedError, match="fp16_statistics"):
        set_module_tensor_to_device(model, "0.bias", "cpu", fp16_statistics=torch.ones(1))


class _WithMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)
        self.inner.register_buffer("mask", torch.ones(3), persistent=False)
        self.register_buffer("scale", torch.ones(5, dtype=torch.float64))


def test_buffer_helpers():
    model = _WithMask()
    assert get_non_persistent_buffers(model) == set()
    assert get_non_persistent_buffers(model, recurse=True) == {"mask"}
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"inner.mask"}
    returned = get_non_persistent_buffers(model.inner)
    returned.add("x")
    assert model.inner._non_persistent_buffers_set == {"mask"}  # a copy, not the module's own set
    assert compute_module_total_buffer_size(model) == 3 * 4 + 5 * 8
    assert compute_module_total_buffer_size(model, dtype=torch.float16) == 3 * 2 + 5 * 2


def test_same_results_as_accelerate():
    """The oracle: Accelerate's functions give the same tensors, dtypes and sizes on the same calls."""
    modeling = pytest.importorskip("accelerate.utils.modeling", reason="Accelerate (the oracle) is a dev-venv package")
    results = []
    for place in (set_module_tensor_to_device, modeling.set_module_tensor_to_device):
        torch.manual_seed(0)
        model = _model()
        place(model, "0.weight", "cpu", value=torch.arange(12.0, dtype=torch.float64).reshape(4, 3))
        place(model, "1.running_var", "cpu", value=torch.arange(4), dtype=torch.float16)
        place(model, "0.bias", "cpu", dtype=torch.float16)
        results.append({name: (tensor.dtype, tensor.clone()) for name, tensor in model.state_dict().items()})
    assert results[0].keys() == results[1].keys()
    for name in results[0]:
        assert results[0][name][0] == results[1][name][0], name
        assert torch.equal(results[0][name][1], results[1][name][1]), name
    model = _WithMask()
    assert compute_module_total_buffer_size(model) == modeling.compute_module_total_buffer_size(model)
    assert get_non_persistent_buffers(model, recurse=True) == modeling.get_non_persistent_buffers(model, recurse=True)
