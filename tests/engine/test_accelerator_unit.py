"""The Accelerator's single-process surface: configuration errors, utilities, iterable data, trackers."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from trainkit import Accelerator, DataLoaderConfiguration, DistributedType
from trainkit.config import ConfigError
from trainkit.utils import find_executable_batch_size, set_seed


def test_bad_mixed_precision_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"'bf61'.*Did you mean 'bf16'.*no, fp16, bf16"):
        Accelerator(mixed_precision="bf61")


def test_bad_tracker_name_is_named():
    with pytest.raises(ConfigError, match=r"'tensorbord'.*Did you mean 'tensorboard'"):
        Accelerator(log_with="tensorbord")


def test_split_batches_needs_a_divisible_batch_size():
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=3)
    assert len(accelerator.prepare(loader)) == 4  # one process divides anything


def test_single_process_identity():
    accelerator = Accelerator()
    assert accelerator.distributed_type == DistributedType.NO
    assert (accelerator.num_processes, accelerator.process_index, accelerator.is_main_process) == (1, 0, True)
    assert accelerator.device == torch.device("cpu") and not accelerator.use_distributed
    accelerator.gradient_accumulation_steps = 3
    assert accelerator.gradient_accumulation_steps == 3


def test_unwrap_model_can_drop_the_autocast_forward():
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(nn.Linear(3, 2))
    assert model(torch.ones(1, 3)).dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain(torch.ones(1, 3)).dtype == torch.bfloat16


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10))


def test_iterable_datasets_are_batched_and_counted():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(Stream(), batch_size=4))
    batches = [accelerator.gather_for_metrics(b) for b in loader]
    assert torch.cat(batches).tolist() == list(range(10))


def test_find_executable_batch_size_tries_90_percent_after_out_of_memory():
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 50:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return batch_size

    # Accelerate 1.x's schedule: int(size * 0.9) each time (57 = int(64 * 0.9), 51, 45).
    assert train() == 45 and tried == [64, 57, 51, 45]


def test_set_seed_makes_draws_repeat():
    set_seed(7)
    a = torch.rand(3)
    set_seed(7)
    assert torch.equal(a, torch.rand(3))


def test_jsonl_tracker_records_every_log(tmp_path):
    accelerator = Accelerator(project_dir=tmp_path, log_with="jsonl")
    accelerator.init_trackers("run", config={"lr": 0.1})
    accelerator.log({"loss": torch.tensor(0.5), "lr": 0.1}, step=3)
    accelerator.end_training()
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert record["step"] == 3 and record["loss"] == 0.5
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"lr": 0.1}


def test_no_tracker_file_unless_one_is_named(tmp_path, monkeypatch):
    """As Accelerate: without log_with, init_trackers and log write nothing (no runs/ folder in the working directory
    either); with log_with="tensorboard" the run's folder holds TensorBoard's files only."""
    monkeypatch.chdir(tmp_path)
    accelerator = Accelerator(project_dir=tmp_path / "project")
    accelerator.init_trackers("run", config={"lr": 0.1})
    accelerator.log({"loss": 0.5}, step=1)
    accelerator.end_training()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="jsonl"):
        Accelerator(log_with="jsonl")  # a tracker that writes files needs a folder, as Accelerate's TensorBoard does
    pytest.importorskip("tensorboard", reason="the TensorBoard half needs the optional tensorboard package")
    accelerator = Accelerator(project_dir=tmp_path / "project", log_with="tensorboard")
    accelerator.init_trackers("run")
    accelerator.log({"loss": 0.5}, step=1)
    accelerator.end_training()
    assert all(path.name.startswith("events.out.tfevents") for path in (tmp_path / "project" / "run").iterdir())


def test_prepare_keeps_order_and_returns_one_object_for_one_argument():
    accelerator = Accelerator()
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    prepared_loader, prepared_model, prepared_optimizer = accelerator.prepare(loader, model, optimizer)
    assert isinstance(prepared_loader, DataLoader) and prepared_loader.dataset is loader.dataset
    assert prepared_model is model and prepared_optimizer.optimizer is optimizer
    assert accelerator.prepare(nn.Linear(1, 1)).__class__ is nn.Linear


def test_accelerate_helpers_scripts_import(tmp_path, caplog):
    from safetensors.torch import load_file

    from trainkit import PartialState
    from trainkit.logging import get_logger

    accelerator = Accelerator()
    assert PartialState().device == accelerator.state.device and accelerator.state.num_processes == 1
    accelerator.save({"w": torch.ones(2)}, tmp_path / "w.safetensors", safe_serialization=True)
    assert torch.equal(load_file(tmp_path / "w.safetensors")["w"], torch.ones(2))
    logger = get_logger("trainkit.test")
    with caplog.at_level("INFO", logger="trainkit.test"):
        logger.info("hello %s", "world", main_process_only=True)
        logger.info("in order", in_order=True)
    assert [r.getMessage() for r in caplog.records] == ["hello world", "in order"]
