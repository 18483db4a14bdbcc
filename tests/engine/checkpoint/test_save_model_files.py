"""``Accelerator.save_model``'s files, in both formats: Accelerate's names, shards and index, read back by
``load_checkpoint_in_model``; and, where Accelerate is installed, the same folder as Accelerate writes.

CPU, one process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from trainkit import Accelerator
from trainkit.utils import load_checkpoint_in_model


class TiedNet(nn.Module):
    """An embedding whose weight the output layer shares, beside an untied layer and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.middle = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.arange(4.0))


def _big_in_the_middle() -> nn.Module:
    """Small layers around one whose weight (14,400 bytes) is over the 1 KB shard limit used below."""
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(60, 60), nn.Linear(4, 4), nn.Linear(8, 8))


def _read(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path) if path.suffix == ".safetensors" else torch.load(path, weights_only=True)


def _assert_folder_holds(folder: Path, model: nn.Module) -> None:
    """Every tensor of the model's state dict is in the folder's files, equal, and nothing else is."""
    files = [folder / name for name in os.listdir(folder) if not name.endswith(".json")]
    saved: dict[str, torch.Tensor] = {}
    for path in files:
        saved.update(_read(path))
    expected = model.state_dict()
    tied_names = {"head.weight"} if isinstance(model, TiedNet) and files[0].suffix == ".safetensors" else set()
    assert sorted(saved) == sorted(set(expected) - tied_names)
    assert all(torch.equal(saved[name], expected[name]) for name in saved)


def test_unsafe_serialization_writes_one_torch_file_with_accelerates_name(tmp_path):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    accelerator.save_model(model, tmp_path / "bin", safe_serialization=False)
    accelerator.save_model(model, tmp_path / "safe")
    assert os.listdir(tmp_path / "bin") == ["pytorch_model.bin"]
    assert os.listdir(tmp_path / "safe") == ["model.safetensors"]
    _assert_folder_holds(tmp_path / "bin", model)
    _assert_folder_holds(tmp_path / "safe", model)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "torch"])
def test_a_weight_over_the_limit_gets_a_shard_of_its_own_and_the_index_is_accelerates(tmp_path, safe):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(1)
    model = accelerator.prepare(_big_in_the_middle())
    accelerator.save_model(model, tmp_path, max_shard_size="1KB", safe_serialization=safe)
    prefix, suffix = ("model", ".safetensors") if safe else ("pytorch_model", ".bin")
    first, second, index = f"{prefix}-00001-of-00002{suffix}", f"{prefix}-00002-of-00002{suffix}", f"{prefix}{suffix}.index.json"
    assert sorted(os.listdir(tmp_path)) == sorted([first, second, index])
    text = (tmp_path / index).read_text()
    assert text.endswith("}\n")
    contents = json.loads(text)
    assert text == json.dumps(contents, indent=2, sort_keys=True) + "\n"
    assert contents["metadata"] == {"total_size": sum(t.numel() * t.element_size() for t in model.state_dict().values())}
    # huggingface_hub's rule (Accelerate's): the 1.weight over the limit is a shard placed where it was met, before the
    # shard still being filled with what comes before and after it
    assert contents["weight_map"] == {"1.weight": first, **{name: second for name in (
        "0.weight", "0.bias", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias")}}
    for shard in (first, second):
        assert sorted(_read(tmp_path / shard)) == sorted(k for k, v in contents["weight_map"].items() if v == shard)
    _assert_folder_holds(tmp_path, model)


def test_shards_are_huggingface_hubs_split(tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Sequential(nn.Linear(30, 30), nn.Linear(64, 8), nn.Linear(2, 2), nn.Linear(40, 40)))
    for limit in ("1KB", "3KB", 5000, "10GB"):
        accelerator.save_model(model, tmp_path / str(limit), max_shard_size=limit, safe_serialization=False)
        split = split_torch_state_dict_into_shards(model.state_dict(), filename_pattern="pytorch_model{suffix}.bin",
                                                   max_shard_size=limit)
        assert sorted(os.listdir(tmp_path / str(limit))) == sorted(
            [*split.filename_to_tensors, *(["pytorch_model.bin.index.json"] if split.is_sharded else [])])
        for filename, names in split.filename_to_tensors.items():
            assert sorted(_read(tmp_path / str(limit) / filename)) == sorted(names)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "torch"])
def test_tied_weights_are_saved_once_and_load_back_tied(tmp_path, safe):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(2)
    model = accelerator.prepare(TiedNet())
    accelerator.save_model(model, tmp_path, max_shard_size="1KB", safe_serialization=safe)
    index = json.loads((tmp_path / ("model.safetensors.index.json" if safe else "pytorch_model.bin.index.json")).read_text())
    if safe:  # safetensors holds no aliases: the tied name is left out of the shards and named in the metadata
        assert "head.weight" not in index["weight_map"] and index["metadata"]["tied"] == {"head.weight": "embed.weight"}
    else:  # torch's format keeps both names in one shard, sharing one storage
        shard = _read(tmp_path / index["weight_map"]["embed.weight"])
        assert index["weight_map"]["head.weight"] == index["weight_map"]["embed.weight"]
        assert shard["head.weight"].untyped_storage().data_ptr() == shard["embed.weight"].untyped_storage().data_ptr()
    _assert_folder_holds(tmp_path, model)
    torch.manual_seed(3)
    fresh = TiedNet()
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert fresh.head.weight is fresh.embed.weight
    assert all(torch.equal(fresh.state_dict()[name], value) for name, value in model.state_dict().items())


def test_a_new_save_removes_the_files_of_the_previous_save_of_its_format_only(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Sequential(nn.Linear(30, 30), nn.Linear(30, 30), nn.Linear(30, 30)))
    accelerator.save_model(model, tmp_path, max_shard_size="4KB", safe_serialization=False)
    accelerator.save_model(model, tmp_path, max_shard_size="4KB")
    assert len(os.listdir(tmp_path)) == 8  # 3 shards and an index in each format
    (tmp_path / "notes.txt").write_text("kept")
    accelerator.save_model(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([
        "model.safetensors", "notes.txt", "pytorch_model-00001-of-00003.bin", "pytorch_model-00002-of-00003.bin",
        "pytorch_model-00003-of-00003.bin", "pytorch_model.bin.index.json"])
    accelerator.save_model(model, tmp_path, max_shard_size="8KB", safe_serialization=False)
    assert sorted(os.listdir(tmp_path)) == sorted([
        "model.safetensors", "notes.txt", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json"])


def test_save_model_into_a_file_path_is_refused(tmp_path):
    accelerator = Accelerator(cpu=True)
    (tmp_path / "weights").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        accelerator.save_model(nn.Linear(2, 2), tmp_path / "weights")


def test_the_folder_is_the_one_accelerate_writes(tmp_path):
    """The same model saved by Accelerate (the oracle, when installed) and by trainkit: same file names, same
    index text (the tied-names metadata aside), same tensors in each file."""
    accelerate = pytest.importorskip("accelerate", reason="Accelerate is the oracle here; not a dependency")
    oracle = accelerate.Accelerator(cpu=True)
    ours = Accelerator(cpu=True)
    for make in (_big_in_the_middle, TiedNet):
        torch.manual_seed(4)
        model = make()
        for safe in (True, False):
            for limit in ("10GB", "1KB", "3KB"):
                case = f"{make.__name__}-{safe}-{limit}"
                oracle.save_model(model, tmp_path / "accelerate" / case, max_shard_size=limit, safe_serialization=safe)
                ours.save_model(model, tmp_path / "trainkit" / case, max_shard_size=limit, safe_serialization=safe)
                theirs_folder, ours_folder = tmp_path / "accelerate" / case, tmp_path / "trainkit" / case
                assert sorted(os.listdir(ours_folder)) == sorted(os.listdir(theirs_folder)), case
                for name in os.listdir(ours_folder):
                    if name.endswith(".json"):
                        mine, theirs = json.loads((ours_folder / name).read_text()), json.loads((theirs_folder / name).read_text())
                        mine["metadata"].pop("tied", None)
                        assert mine == theirs, case
                        continue
                    mine_tensors, their_tensors = _read(ours_folder / name), _read(theirs_folder / name)
                    assert sorted(mine_tensors) == sorted(their_tensors), (case, name)
                    assert all(torch.equal(mine_tensors[key], their_tensors[key]) for key in their_tensors), (case, name)
