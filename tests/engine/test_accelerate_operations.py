"""``trainkit.utils.operations`` helpers with Accelerate's signatures, on nests of tensors (CPU, one process)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from trainkit.utils import operations as ops


def test_recursively_apply_passes_extra_arguments_and_keeps_types():
    Pair = namedtuple("Pair", "a b")
    data = {"x": [torch.ones(2), Pair(torch.zeros(1), "label")]}
    out = ops.recursively_apply(lambda t, k, shift=0: t * k + shift, data, 3, shift=1)
    assert out["x"][0].tolist() == [4.0, 4.0] and isinstance(out["x"][1], Pair) and out["x"][1].b == "label"
    assert ops.recursively_apply(str.upper, ["a", 1], test_type=lambda v: isinstance(v, str)) == ["A", 1]
    with pytest.raises(TypeError, match="str"):
        ops.recursively_apply(lambda t: t, [torch.ones(1), "text"], error_on_other_type=True)
    # The error names what was refused, the function and the type test the objects must pass.
    with pytest.raises(TypeError) as refused:
        ops.recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert all(word in str(refused.value) for word in ("int", "tensor", "is_torch_tensor")), refused.value


def test_send_to_device_leaves_skipped_keys_alone():
    marker = object()
    batch = {"input_ids": torch.ones(2), "meta": marker, "nested": {"meta": marker, "y": [torch.zeros(1)]}}
    moved = ops.send_to_device(batch, "cpu", skip_keys="meta")
    assert moved["meta"] is marker and moved["nested"]["meta"] is marker and moved["nested"]["y"][0].shape == (1,)
    assert ops.send_to_device(batch, torch.device("cpu"), non_blocking=True)["input_ids"].device.type == "cpu"


def test_structure_round_trip_allocates_matching_tensors():
    data = {"a": torch.ones(2, 3, dtype=torch.bfloat16), "b": (torch.zeros(4, dtype=torch.int64),)}
    structure = ops.get_data_structure(data)
    assert ops.is_tensor_information(structure["a"]) and ops.get_shape(data) == {"a": [2, 3], "b": ([4],)}
    fresh = ops.initialize_tensors(structure)
    assert fresh["a"].shape == (2, 3) and fresh["a"].dtype == torch.bfloat16 and fresh["b"][0].dtype == torch.int64
    assert ops.TENSOR_INT_TO_DTYPE[ops.TENSOR_TYPE_TO_INT[torch.bfloat16]] is torch.bfloat16
    assert ops.ignorant_find_batch_size({"text": "no tensors"}) is None and ops.ignorant_find_batch_size(data) == 2
    assert ops.is_namedtuple(namedtuple("P", "x")(1)) and not ops.is_namedtuple((1,))


def test_pad_input_tensors_pads_to_a_share_for_every_process():
    padded = ops.pad_input_tensors(torch.arange(5.0), batch_size=5, num_processes=2)
    assert padded.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    assert ops.pad_input_tensors(torch.ones(1, 2), batch_size=1, num_processes=4).shape == (4, 2)
    assert torch.equal(ops.pad_input_tensors(torch.ones(4), batch_size=4, num_processes=2), torch.ones(4))


def test_convert_outputs_to_fp32_wraps_a_forward():
    forward = ops.convert_outputs_to_fp32(lambda x: {"logits": x.to(torch.float16), "ids": x.long()})
    out = forward(torch.ones(2))
    assert out["logits"].dtype == torch.float32 and out["ids"].dtype == torch.int64
    assert ops.ConvertOutputsToFp32(lambda: torch.zeros(1, dtype=torch.bfloat16))().dtype == torch.float32


def test_chained_operation_names_the_outer_call():
    @ops.chained_operation
    def outer():
        raise ops.DistributedOperationException("inner")

    with pytest.raises(ops.DistributedOperationException, match="outer") as raised:
        outer()
    assert str(raised.value.__cause__) == "inner"


def test_gathered_parameters_and_tensor_shape_on_one_process():
    with ops.GatheredParameters([torch.nn.Parameter(torch.ones(1))], modifier_rank=0):
        pass
    assert ops.gather_tensor_shape(torch.ones(2, 3)).tolist() == [2, 3]
    with pytest.raises(ops.DistributedOperationException, match="exactly one"):
        ops.gather_tensor_shape(None)
