"""The offload folder format (trainkit.utils.offload, Accelerate's accelerate.utils.offload API): ``.dat`` files
and ``index.json``, read back bit for bit for every dtype, readable by NumPy as memmaps, exchanged with the
installed Accelerate both ways (where it is installed), and the lazy weight maps. CPU only, in-process."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from trainkit.utils import (OffloadedWeightsLoader, PrefixedDataset, load_offloaded_weight, offload_state_dict,
                            offload_weight, save_offload_index)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int64,
          torch.int8, torch.uint8, torch.bool, torch.float64]


def _sample(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(shape, generator=generator) * 50
    return (values > 0) if dtype == torch.bool else values.to(dtype)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes: equality of bits, which float comparison (NaN, -0.0, FP8 without ==) would not check."""
    return tensor.reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 4)], ids=["matrix", "scalar", "empty"])
def test_weight_round_trips_bit_for_bit_with_its_index_entry(tmp_path, dtype, shape):
    weight = _sample(dtype, shape)
    index = offload_weight(weight, "block.weight", tmp_path, index={})
    assert index == {"block.weight": {"dtype": str(dtype).split(".")[1], "shape": list(shape)}}
    path = tmp_path / "block.weight.dat"
    assert path.stat().st_size == max(weight.numel(), 1 if shape == () else 0) * weight.element_size()
    loaded = load_offloaded_weight(path, index["block.weight"])
    assert loaded.dtype == dtype and loaded.shape == weight.shape
    assert torch.equal(_bits(loaded), _bits(weight))


def test_dat_file_is_what_a_numpy_memmap_of_that_dtype_reads(tmp_path):
    weight = _sample(torch.float32)
    offload_weight(weight, "w", tmp_path)
    mapped = np.memmap(tmp_path / "w.dat", dtype="float32", mode="r", shape=(3, 5))
    assert torch.equal(torch.from_numpy(np.array(mapped)), weight)


def test_state_dict_folder_has_index_and_files_and_indexes_merge(tmp_path):
    state = {"a.weight": _sample(torch.float32), "b.bias": _sample(torch.bfloat16, (4,))}
    offload_state_dict(tmp_path / "folder", state)
    index = json.loads((tmp_path / "folder" / "index.json").read_text())
    assert index == {"a.weight": {"dtype": "float32", "shape": [3, 5]}, "b.bias": {"dtype": "bfloat16", "shape": [4]}}
    save_offload_index({"c": {"dtype": "int64", "shape": [1]}}, tmp_path / "folder")
    save_offload_index({}, tmp_path / "folder")  # nothing to add: the index stays as it is
    assert set(json.loads((tmp_path / "folder" / "index.json").read_text())) == {"a.weight", "b.bias", "c"}
    assert sorted(os.listdir(tmp_path / "folder")) == ["a.weight.dat", "b.bias.dat", "index.json"]


def test_folders_are_exchanged_with_accelerate_both_ways(tmp_path):
    offload = pytest.importorskip("accelerate.utils.offload", reason="the installed Accelerate is the oracle")
    state = {f"w{i}": _sample(dtype) for i, dtype in enumerate(DTYPES) if dtype != torch.bool}
    offload.offload_state_dict(str(tmp_path / "theirs"), state)
    offload_state_dict(tmp_path / "ours", state)
    assert (json.loads((tmp_path / "theirs" / "index.json").read_text())
            == json.loads((tmp_path / "ours" / "index.json").read_text()))
    ours_read_theirs = OffloadedWeightsLoader(save_folder=tmp_path / "theirs")
    theirs_read_ours = offload.OffloadedWeightsLoader(save_folder=str(tmp_path / "ours"))
    for name, tensor in state.items():
        assert (tmp_path / "theirs" / f"{name}.dat").read_bytes() == (tmp_path / "ours" / f"{name}.dat").read_bytes()
        assert torch.equal(_bits(ours_read_theirs[name]), _bits(tensor))
        assert torch.equal(_bits(theirs_read_ours[name]), _bits(tensor))


def test_loader_prefers_the_state_dict_and_lists_each_key_once(tmp_path):
    on_disk = {"x": torch.zeros(2), "y": torch.ones(3)}
    offload_state_dict(tmp_path, on_disk)
    loader = OffloadedWeightsLoader(state_dict={"x": torch.full((2,), 7.0)}, save_folder=tmp_path)
    assert list(loader) == ["x", "y"] and len(loader) == 2
    assert torch.equal(loader["x"], torch.full((2,), 7.0)) and torch.equal(loader["y"], torch.ones(3))
    with pytest.raises(ValueError, match="state_dict, a save_folder or an index"):
        OffloadedWeightsLoader()


def test_loader_reads_safetensors_entries_of_an_index(tmp_path):
    save_file({"stored.name": torch.arange(4.0)}, str(tmp_path / "model.safetensors"))
    index = {"layer.weight": {"safetensors_file": str(tmp_path / "model.safetensors"), "weight_name": "stored.name",
                              "dtype": "float16"}}
    value = OffloadedWeightsLoader(index=index)["layer.weight"]
    assert value.dtype == torch.float16 and torch.equal(value, torch.arange(4.0).half())


def test_prefixed_dataset_reads_under_its_prefix():
    data = {"block.a": 1, "block.b": 2, "other.a": 3}
    view = PrefixedDataset(data, "block.")
    assert view["a"] == 1 and list(view) == ["block.a", "block.b"]
