"""``trainkit.utils``' model-tensor helpers with Accelerate's names (CPU, one process, tiny models)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainkit import utils


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(1), persistent=False)


def test_tied_parameters_are_found_and_retied():
    model = TiedLM()
    assert utils.find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    model.head.weight = nn.Parameter(torch.zeros(10, 4))
    assert utils.find_tied_parameters(model) == []
    utils.retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight


def test_state_dict_cleaning_sizes_and_submodules():
    model = TiedLM()
    state = utils.clean_state_dict_for_safetensors(dict(model.state_dict()))
    assert "head.weight" not in state and "embed.weight" in state
    a, b = torch.zeros(4), torch.zeros(4)
    assert utils.id_tensor_storage(a) != utils.id_tensor_storage(b)
    assert utils.id_tensor_storage(a[:2]) == utils.id_tensor_storage(a)
    assert utils.dtype_byte_size(torch.bfloat16) == 2 and utils.dtype_byte_size(torch.bool) == 1 / 8
    assert utils.dtype_byte_size(utils.CustomDtype.INT4) == 0.5
    assert utils.convert_file_size_to_int("5GB") == 5 * 10**9 and utils.convert_file_size_to_int("1KiB") == 1024
    with pytest.raises(ValueError, match="unit"):
        utils.convert_file_size_to_int("lots")
    sizes = utils.compute_module_sizes(model)
    assert sizes["blocks.0"] == (16 + 4) * 4 and sizes[""] == sum(p.numel() * 4 for p in model.parameters()) + 4
    assert utils.compute_module_sizes(model, dtype="float16")["blocks.0"] == (16 + 4) * 2
    sub = utils.extract_submodules_state_dict({"blocks.1.w": 1, "blocks.10.w": 2, "blocks.1": 3}, ["blocks.1"])
    assert sub == {"blocks.1.w": 1, "blocks.1": 3}
    assert [name for name, _ in utils.named_module_tensors(model, recurse=True, remove_non_persistent=True)] == [
        "embed.weight", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias"]


def test_children_bottom_up_and_dtensor_check():
    model = TiedLM()
    order = [name for name, _ in utils.get_module_children_bottom_up(model, return_fqns=True)]
    assert order[-1] == "" and order.index("blocks.0") < order.index("blocks")
    assert utils.model_has_dtensor(model) is False


def test_loading_weights_never_unpickles_objects(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    assert utils.load_state_dict(str(tmp_path / "m.safetensors"))["w"].tolist() == [1.0, 1.0]
    torch.save({"w": torch.zeros(1)}, tmp_path / "m.bin")
    assert utils.load_state_dict(str(tmp_path / "m.bin"))["w"].tolist() == [0.0]
    torch.save({"object": object()}, tmp_path / "pickle.bin")
    with pytest.raises(Exception, match="[Ww]eights only"):
        utils.load(tmp_path / "pickle.bin")
    # with a device map, a safetensors file is read straight onto each tensor's device; torch files on the CPU
    assert utils.load_state_dict(str(tmp_path / "m.safetensors"), device_map={"": "cpu"})["w"].device.type == "cpu"
    assert utils.load_state_dict(str(tmp_path / "m.bin"), device_map={"w": "disk"})["w"].device.type == "cpu"


def test_process_and_device_information(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "4")
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    info = utils.get_cpu_distributed_information()
    assert (info.rank, info.world_size, info.local_rank) == (3, 4, 0)
    names, count = utils.get_gpu_info()
    assert count == len(names) and isinstance(utils.check_cuda_p2p_ib_support(), bool)
    assert type(utils.get_grad_scaler()).__name__ == "GradScaler"
    assert type(utils.get_grad_scaler(utils.DistributedType.FSDP)).__name__ == "ShardedGradScaler"
