"""Behaviours Accelerate's own unit tests rely on, pinned in trainkit's own words (CPU, one process unless marked).

Found by running Accelerate 1.15's test suite against trainkit (docs/migrating-from-accelerate.md, "Checked against
Accelerate's own test suite"); each test here fails on the behaviour trainkit had before.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from trainkit import Accelerator


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = self.a


def test_release_memory_returns_one_none_per_object():
    from trainkit.utils import release_memory
    from trainkit.utils.memory import clear_device_cache, should_reduce_batch_size

    a, b = release_memory(torch.ones(2), torch.ones(3))  # unpacks as in Accelerate (it returned [] before)
    assert a is None and b is None
    clear_device_cache(garbage_collection=True)
    assert should_reduce_batch_size(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not should_reduce_batch_size(ValueError("unrelated"))


def test_tensor_helpers_follow_accelerates_edge_cases():
    from trainkit.utils import CannotPadNestedTensorWarning, concatenate, pad_across_processes

    assert concatenate(["text"]) == "text"  # one batch is returned as it is, tensor or not
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested
    plain = torch.ones(2, 3)
    assert pad_across_processes(plain, dim=-1) is plain and pad_across_processes(plain, dim=-4) is plain


def test_save_with_safetensors_keeps_one_name_per_shared_tensor(tmp_path, caplog):
    from safetensors.torch import load_file

    from trainkit.utils import save

    with caplog.at_level(logging.WARNING):
        save(Tied().state_dict(), tmp_path / "tied.safetensors", safe_serialization=True)
    assert any("Removed shared tensor" in record.getMessage() for record in caplog.records)
    assert sorted(load_file(tmp_path / "tied.safetensors")) == ["a.bias", "a.weight"]


def test_load_checkpoint_in_model_reads_files_indexes_and_folders(tmp_path, caplog):
    from trainkit.utils import load_checkpoint_in_model

    source = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    expected = {k: v.clone() for k, v in source.state_dict().items()}
    torch.save({k: v for k, v in expected.items() if k.startswith("0.")}, tmp_path / "part1.bin")
    torch.save({k: v for k, v in expected.items() if k.startswith("1.")}, tmp_path / "part2.bin")
    (tmp_path / "weights.index.json").write_text(json.dumps(  # a bare name -> shard map, as well as "weight_map"
        {k: "part1.bin" if k.startswith("0.") else "part2.bin" for k in expected}))
    for checkpoint in (tmp_path / "weights.index.json", tmp_path):
        target = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
        load_checkpoint_in_model(target, checkpoint, device_map={"": "cpu"})
        for key, value in target.state_dict().items():
            assert torch.equal(value, expected[key])
    half = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    load_checkpoint_in_model(half, tmp_path, dtype=torch.float16, keep_in_fp32_modules=["1"])
    assert half[0].weight.dtype == torch.float16 and half[1].weight.dtype == torch.float32
    torch.save({**expected, "extra": torch.ones(1)}, tmp_path / "extra.pt")
    with caplog.at_level(logging.WARNING):
        load_checkpoint_in_model(nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)), tmp_path / "extra.pt")
    assert any("were not used when" in record.getMessage() for record in caplog.records)
    with pytest.raises(RuntimeError, match="extra"):
        load_checkpoint_in_model(nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)), tmp_path / "extra.pt", strict=True)
    with pytest.raises(ValueError, match="offload_folder"):  # a map with "disk" needs a folder to write to
        load_checkpoint_in_model(half, tmp_path, device_map={"0": "cpu", "1": "disk"})


def test_module_sizes_count_each_tensor_and_file_sizes_refuse_negatives():
    from trainkit.utils import compute_module_sizes, convert_file_size_to_int

    sizes = compute_module_sizes(nn.Linear(2, 3))  # float32: weight 6 x 4 bytes, bias 3 x 4
    assert sizes == {"": 36, "weight": 24, "bias": 12}
    assert convert_file_size_to_int("2GiB") == 2 * 2**30
    with pytest.raises(ValueError):
        convert_file_size_to_int("-1GB")


def test_get_model_tp_size_reads_the_model_or_its_distributed_config():
    from types import SimpleNamespace

    from trainkit.utils import get_model_tp_size

    model = nn.Linear(1, 1)
    assert get_model_tp_size(model) is None
    model.config = SimpleNamespace(distributed_config={"tp_size": 4})
    assert get_model_tp_size(model) == 4
    model.tp_size = 2
    assert get_model_tp_size(model) == 2


def test_purge_accelerate_environment_also_covers_a_subclass_tests():
    from trainkit.utils import purge_accelerate_environment

    @purge_accelerate_environment
    class Base:
        pass

    class Child(Base):
        def test_sets(self):
            os.environ["ACCELERATE_PARITY_PROBE"] = "1"

    Child().test_sets()
    assert "ACCELERATE_PARITY_PROBE" not in os.environ


def test_dynamo_plugin_reads_accelerates_variables_and_reports_what_differs(monkeypatch):
    from trainkit.utils import TorchDynamoPlugin

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    assert TorchDynamoPlugin().to_kwargs() == {"backend": "aot_eager", "mode": "reduce-overhead"}
    assert TorchDynamoPlugin(backend="inductor").backend == "inductor"  # an argument beats the variable
    assert os.environ["ACCELERATE_DYNAMO_BACKEND"] == "aot_eager"  # to_kwargs leaves the environment as it was


def test_logger_records_name_the_callers_line(caplog):
    from trainkit.logging import get_logger

    logger = get_logger("trainkit.parity.probe")
    with caplog.at_level(logging.INFO, logger="trainkit.parity.probe"):
        logger.info("here")
    record = caplog.records[-1]
    assert record.filename == Path(__file__).name and record.funcName == "test_logger_records_name_the_callers_line"


def test_check_os_kernel_names_the_kernel_in_the_message(caplog):
    from trainkit.utils import check_os_kernel

    with mock.patch("platform.uname", return_value=mock.Mock(release="5.4.0-35-generic", system="Linux")):
        with caplog.at_level(logging.WARNING):
            check_os_kernel()
    assert "5.4.0" in caplog.records[-1].msg and "5.5.0" in caplog.records[-1].msg


def test_prepared_objects_carry_accelerates_mark_and_are_not_prepared_twice():
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    prepared = accelerator.prepare(model, optimizer, scheduler, loader, [1, 2])
    assert all(getattr(obj, "_is_accelerate_prepared", False) for obj in prepared[:4])
    assert not hasattr(prepared[4], "_is_accelerate_prepared")
    assert accelerator.prepare_model(prepared[0]) is prepared[0] and len(accelerator._models) == 1


def test_a_skipped_optimizer_step_is_read_from_accelerates_attribute():
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer._is_overflow = True  # what Accelerate's own tests set to simulate an fp16 overflow
    scheduler.step()
    assert scheduler.get_last_lr() == [1.0] and optimizer.step_was_skipped
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr() == [0.9]


def test_register_for_checkpointing_names_the_invalid_items():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="Item at index 1, `Tensor`"):
        accelerator.register_for_checkpointing(nn.Linear(1, 1), torch.ones(1))


def test_adam_betas_stay_a_tuple_after_load_state(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    accelerator.load_state(accelerator.save_state(tmp_path / "ckpt"))
    assert optimizer.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)  # a list before


def test_unwrap_model_restores_a_forward_saved_under_accelerates_name():
    from trainkit.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = nn.Linear(2, 2)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__
    pickle.dumps(model)  # the local wrapper function made it unpicklable


def test_folder_trackers_need_a_logging_dir_when_the_accelerator_is_made():
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (extra 'tensorboard')")
    with pytest.raises(ValueError, match="Logging with `tensorboard` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="tensorboard")


def test_mlflow_nested_run_variable_is_read_as_yes_or_no(monkeypatch):
    from trainkit.tracking import MLflowTracker

    monkeypatch.setenv("MLFLOW_NESTED_RUN", "False")
    assert MLflowTracker(experiment_name="e").nested_run is False  # bool("False") was True
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "yes")
    assert MLflowTracker(experiment_name="e").nested_run is True


def test_accelerate_module_paths_of_features_not_driven_import_and_refuse():
    import trainkit.big_modeling
    import trainkit.hooks
    import trainkit.utils.bnb
    import trainkit.utils.launch
    import trainkit.utils.offload
    from trainkit.utils.modeling import compute_module_sizes  # size helpers are real at this path too

    with trainkit.big_modeling.init_empty_weights():
        assert nn.Linear(2, 2).weight.device.type == "meta"
    assert trainkit.hooks.ModelHook and trainkit.utils.offload.offload_weight  # big-model inference: real names
    for refused in (lambda: trainkit.utils.bnb.replace_with_bnb_layers(None, None),
                    lambda: trainkit.utils.launch.prepare_multi_gpu_env(None)):
        with pytest.raises(NotImplementedError, match="trainkit"):
            refused()
    assert compute_module_sizes(nn.Linear(1, 1))[""] == 8


def _rank_and_value(value: int) -> tuple[int, int]:
    from trainkit.state import PartialState

    return PartialState().process_index, value


@pytest.mark.multiprocess
def test_debug_launcher_takes_a_partial():
    """Accelerate's tests launch ``functools.partial`` objects (2 forked CPU processes, gloo)."""
    from trainkit import debug_launcher

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = debug_launcher(functools.partial(_rank_and_value, 7), num_processes=2)
    assert sorted(results.values()) == [(0, 7), (1, 7)]


def test_build_device_mesh_makes_accelerates_mesh_with_its_flattened_views():
    """``ParallelismConfig.build_device_mesh`` (on the class scripts import) builds the enabled dimensions and the
    flattened ``dp``/``dp_shard_cp``/``dp_cp`` views; checked on torch's fake process group of 8 ranks (one CPU
    process, no communication)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import trainkit
    import trainkit.utils
    from trainkit.parallelism_config import ParallelismConfig

    assert trainkit.ParallelismConfig is trainkit.utils.ParallelismConfig is ParallelismConfig
    assert ParallelismConfig().build_device_mesh("cpu") is None  # nothing above 1: no mesh, as in Accelerate
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
        mesh = config.get_device_mesh("cpu")
        assert (mesh.mesh_dim_names, tuple(mesh.shape)) == (("dp_replicate", "dp_shard", "tp"), (2, 2, 2))
        assert [mesh[name].size() for name in ("dp", "dp_shard_cp", "dp_cp")] == [4, 2, 4]
        assert config.get_device_mesh() is mesh
        with pytest.raises(ValueError, match="built for 'cpu'"):
            config.get_device_mesh("cuda")
        sharded = ParallelismConfig(dp_shard_size=4, cp_size=2).build_device_mesh("cpu")
        assert (sharded.mesh_dim_names, sharded["dp_shard_cp"].size()) == (("dp_shard", "cp"), 8)
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="pass the device_type"):
        ParallelismConfig().get_device_mesh()


def test_build_device_mesh_flattens_with_the_configs_own_name_lists(monkeypatch):
    """Scripts stand in for torch's mesh to see what is flattened (Accelerate's own test does): each view is taken
    with the list the config's ``*_dim_names`` property returns, as Accelerate indexes, in the order dp,
    dp_shard_cp, dp_cp. CPU only, no process group."""
    from torch.distributed import device_mesh

    from trainkit.parallelism_config import ParallelismConfig

    flattened: list[tuple[object, str]] = []

    class RecordingMesh:
        def __init__(self, names):
            self.names = names

        def __getitem__(self, names):
            outer = self

            class View:
                def _flatten(self, flat_name):
                    flattened.append((names, flat_name))
                    return outer
            return View()

    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda kind, shape, mesh_dim_names: RecordingMesh(mesh_dim_names))
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    config.build_device_mesh("cpu")
    assert flattened == [(config.dp_dim_names, "dp"), (config.dp_shard_cp_dim_names, "dp_shard_cp"),
                         (config.dp_cp_dim_names, "dp_cp")]
    assert all(type(names) is type(config.dp_dim_names) for names, _ in flattened)


def test_recurrent_layers_refused_under_sequence_parallelism_at_accelerates_path():
    """Accelerate's private big_modeling check is trainkit's layer-type check (the one sp/cp preparation runs):
    linear (recurrent) attention refused by its name, full attention and configs without layer types pass."""
    from types import SimpleNamespace

    from trainkit.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism as refuse
    from trainkit.config import ConfigError

    def model(**fields):
        config = SimpleNamespace(**fields)
        config.get_text_config = lambda: config
        return SimpleNamespace(config=config)

    refuse(model(layer_types=["full_attention", "full_attention"]))
    refuse(model())
    with pytest.raises(ConfigError, match="linear_attention"):
        refuse(model(layer_types=["full_attention", "linear_attention"]))
    with pytest.raises(ValueError, match="sliding_attention"):
        refuse(model(sliding_window=8))
