"""Accelerate's public names at trainkit's matching paths, and what each one does on one CPU process.

The table lists, per Accelerate module, the training-related names scripts import; every one must import
from the trainkit module of the same path. Multi-process behaviour: tests/engine/test_surface_processes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

AVAILABILITY = (
    "is_aim_available is_bf16_available is_bnb_available is_boto3_available is_clearml_available "
    "is_comet_ml_available is_cuda_available is_datasets_available is_deepspeed_available is_dvclive_available "
    "is_fp16_available is_fp8_available is_hpu_available is_matplotlib_available is_megatron_lm_available "
    "is_mlflow_available is_mlu_available is_mps_available is_msamp_available is_musa_available is_neuron_available "
    "is_npu_available is_pandas_available is_peft_available is_pynvml_available is_pytest_available "
    "is_rich_available is_schedulefree_available is_sdaa_available is_swanlab_available is_tensorboard_available "
    "is_timm_available is_torch_version is_torch_xla_available is_torchao_available is_torchdata_available "
    "is_torchdata_stateful_dataloader_available is_torchvision_available is_trackio_available "
    "is_transformer_engine_available is_transformers_available is_triton_available is_wandb_available "
    "is_xpu_available").split()

# accelerate path -> names scripts import from it; each must exist at the trainkit path of the same shape.
PUBLIC_NAMES = {
    "trainkit": [
        "Accelerator", "PartialState", "DistributedType", "DataLoaderConfiguration", "AutocastKwargs",
        "DDPCommunicationHookType", "DeepSpeedPlugin", "DistributedDataParallelKwargs", "FullyShardedDataParallelPlugin",
        "GradScalerKwargs", "InitProcessGroupKwargs", "ProfileKwargs", "find_executable_batch_size",
        "init_empty_weights", "init_on_device", "skip_first_batches", "notebook_launcher", "debug_launcher",
    ],
    "trainkit.utils": [
        "DistributedType", "DataLoaderConfiguration", "GradientAccumulationPlugin", "AutocastKwargs",
        "GradScalerKwargs", "ProfileKwargs", "DistributedDataParallelKwargs", "InitProcessGroupKwargs",
        "ProjectConfiguration", "TorchDynamoPlugin", "DynamoBackend", "PrecisionType", "LoggerType", "RNGType",
        "ComputeEnvironment", "SageMakerDistributedType", "DDPCommunicationHookType",
        "KwargsHandler", "DeepSpeedPlugin", "MegatronLMPlugin",
        "MegatronLMDummyScheduler", "FP8RecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "AORecipeKwargs",
        "FullyShardedDataParallelPlugin", "set_seed", "tqdm", "find_executable_batch_size", "release_memory",
        "gather", "gather_object", "broadcast", "broadcast_object_list", "pad_across_processes", "reduce",
        "send_to_device", "copy_tensor_to_devices", "extract_model_from_parallel",
        "wait_for_everyone", "save", "concatenate", "convert_to_fp32", "find_batch_size", "find_device",
        "honor_type", "is_torch_tensor", "listify", "recursively_apply", "slice_tensors", *AVAILABILITY,
    ],
    # Accelerate's test_sync.py and by_feature examples import these three from accelerate.accelerator.
    "trainkit.accelerator": ["Accelerator", "DataLoaderConfiguration", "GradientAccumulationPlugin",
                             "ProjectConfiguration", "DistributedDataParallelKwargs", "GradientState"],
    "trainkit.state": ["PartialState", "AcceleratorState", "GradientState", "DistributedType"],
    "trainkit.logging": ["get_logger", "MultiProcessAdapter"],
    "trainkit.tracking": ["GeneralTracker", "TensorBoardTracker", "WandBTracker", "MLflowTracker"],
    "trainkit.local_sgd": ["LocalSGD"],
    "trainkit.data_loader": [
        "DataLoaderShard", "DataLoaderDispatcher", "BatchSamplerShard", "IterableDatasetShard",
        "SeedableRandomSampler", "SkipBatchSampler", "skip_first_batches", "prepare_data_loader",
    ],
}
# Names Accelerate keeps in submodules (accelerate.utils.operations, .deepspeed, .big_modeling...) or exports
# only when DeepSpeed is installed; trainkit.utils offers them directly too.
ALSO_IN_TRAINKIT_UTILS = ["DistributedOperationException", "verify_operation", "DummyOptim", "DummyScheduler",
                          "FP8BackendType", "init_empty_weights", "init_on_device", "skip_first_batches"]
TABLE = [(module, name) for module, names in PUBLIC_NAMES.items() for name in names]
TABLE += [("trainkit.utils", name) for name in ALSO_IN_TRAINKIT_UTILS]


@pytest.mark.parametrize("module, name", TABLE, ids=[f"{m}.{n}" for m, n in TABLE])
def test_name_imports_from_the_trainkit_path(module, name):
    """What the name is, by Accelerate's naming: a capitalised name a class, a lower-case one a function."""
    value = getattr(importlib.import_module(module), name)
    assert inspect.isclass(value) if name[:1].isupper() else inspect.isroutine(value) or callable(value), type(value)


def test_trainkit_accelerator_names_are_the_same_objects():
    """``trainkit.accelerator`` (``accelerate.accelerator``'s path) re-exports; it defines no second class."""
    import trainkit.accelerator

    homes = [importlib.import_module(m) for m in ("trainkit.utils", "trainkit.state", "trainkit.optimizer",
                                                  "trainkit.scheduler", "trainkit.tracking", "trainkit")]
    for name in trainkit.accelerator.__all__:
        shared = next(getattr(home, name) for home in homes if hasattr(home, name))
        assert getattr(trainkit.accelerator, name) is shared, name


def test_distributed_type_has_all_fourteen_members():
    from trainkit.utils import DistributedType

    assert [m.value for m in DistributedType] == [
        "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
        "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON"]
    assert DistributedType.XLA == "XLA" and DistributedType("FSDP") is DistributedType.FSDP


def test_enums_compare_list_and_contain_like_accelerate():
    from trainkit.utils import LoggerType, PrecisionType

    assert "fp16" in PrecisionType and "fp4" not in PrecisionType and PrecisionType.list() == ["no", "fp8", "fp16", "bf16"]
    assert str(LoggerType.TENSORBOARD) == "tensorboard"


def test_dataloader_configuration_carries_every_field():
    from trainkit.utils import DataLoaderConfiguration

    fields = {f.name: f.default for f in dataclasses.fields(DataLoaderConfiguration)}
    assert fields == {"split_batches": False, "dispatch_batches": None, "even_batches": True,
                      "use_seedable_sampler": False, "data_seed": None, "non_blocking": False,
                      "use_stateful_dataloader": False}


def _loader(n: int = 8, batch: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=batch, shuffle=True)


def _order(config) -> list[float]:
    from trainkit import Accelerator

    loader = Accelerator(cpu=True, dataloader_config=config).prepare(_loader())
    return [x for (batch,) in loader for x in batch.tolist()]


def test_data_seed_fixes_the_order_and_notices_name_inert_fields(caplog):
    from trainkit.utils import DataLoaderConfiguration

    torch.manual_seed(1)
    first = _order(DataLoaderConfiguration(data_seed=7, use_seedable_sampler=True))
    torch.manual_seed(2)
    assert _order(DataLoaderConfiguration(data_seed=7, use_seedable_sampler=True)) == first and sorted(first) == list(map(float, range(8)))
    with caplog.at_level(logging.WARNING):
        dispatched = _order(DataLoaderConfiguration(dispatch_batches=True))  # the main process reads: no notice
    assert sorted(dispatched) == list(map(float, range(8))) and "dispatch_batches" not in caplog.text


def test_non_blocking_reaches_the_prepared_loader():
    from trainkit import Accelerator
    from trainkit.utils import DataLoaderConfiguration

    loader = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(non_blocking=True)).prepare(_loader())
    assert loader.non_blocking is True


def test_features_trainkit_does_not_drive_raise_saying_so():
    from trainkit import Accelerator

    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        Accelerator(cpu=True, megatron_lm_plugin=object())


@pytest.mark.parametrize("name", ["MegatronLMPlugin", "MegatronLMDummyScheduler", "FP8RecipeKwargs",
                                  "TERecipeKwargs", "AORecipeKwargs", "MSAMPRecipeKwargs"])
def test_absent_feature_classes_raise_on_construction(name):
    import trainkit.utils

    with pytest.raises(NotImplementedError, match="trainkit"):
        getattr(trainkit.utils, name)()


def test_gradient_accumulation_plugin_sets_the_steps():
    from trainkit import Accelerator
    from trainkit.utils import GradientAccumulationPlugin

    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4))
    assert accelerator.gradient_accumulation_steps == 4
    with pytest.raises(ValueError, match="not both"):
        Accelerator(cpu=True, gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4))
    with pytest.raises(NotImplementedError, match="sync_with_dataloader"):
        Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False))


def test_unknown_kwargs_handler_is_refused():
    from trainkit import Accelerator

    with pytest.raises(TypeError, match="valid handlers"):
        Accelerator(cpu=True, kwargs_handlers=[object()])


def test_autocast_kwargs_can_switch_autocast_off():
    from trainkit import Accelerator
    from trainkit.utils import AutocastKwargs

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    layer = nn.Linear(4, 4)
    with accelerator.autocast():
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
    with accelerator.autocast(autocast_handler=AutocastKwargs(enabled=False)):
        assert layer(torch.ones(1, 4)).dtype == torch.float32


def test_state_aliases_and_their_attributes():
    from trainkit import Accelerator
    from trainkit.state import AcceleratorState, GradientState, PartialState

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    state = AcceleratorState()
    assert state.__dict__ is accelerator.state.__dict__ and isinstance(accelerator.state, AcceleratorState)
    assert PartialState().num_processes == state.num_processes == 1
    assert state.mixed_precision == "bf16" and state.distributed_type == "NO"
    assert state.deepspeed_plugin is None and state.fsdp_plugin is None
    assert GradientState() is accelerator.gradient_state and isinstance(GradientState(), GradientState)
    assert state.on_local_main_process(lambda: 5)() == 5


def test_single_process_operations():
    from trainkit.utils import (
        concatenate,
        convert_to_fp32,
        extract_model_from_parallel,
        find_batch_size,
        find_device,
        listify,
        reduce,
        send_to_device,
    )

    batch = {"x": torch.ones(3, 2, dtype=torch.bfloat16), "y": [torch.zeros(3)]}
    assert find_batch_size(batch) == 3 and find_device(batch) == torch.device("cpu")
    assert convert_to_fp32(batch)["x"].dtype == torch.float32
    assert send_to_device(batch, "cpu")["y"][0].shape == (3,)
    assert concatenate([{"a": torch.ones(1)}, {"a": torch.zeros(2)}])["a"].tolist() == [1.0, 0.0, 0.0]
    assert listify({"a": torch.tensor([1, 2])}) == {"a": [1, 2]}
    assert reduce(torch.tensor([3.0])).tolist() == [3.0]
    model = nn.Linear(1, 1)
    compiled = torch.compile(model)  # Accelerate's default keeps the compile wrapper; False drops it
    assert extract_model_from_parallel(compiled) is compiled
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model


def test_init_empty_weights_builds_on_meta():
    from trainkit import init_empty_weights

    with init_empty_weights():
        layer = nn.Linear(1000, 1000)
    assert layer.weight.device.type == "meta" and isinstance(layer.weight, nn.Parameter)


def test_tqdm_and_availability_checks():
    from trainkit.utils import is_fp8_available, is_torch_version, is_torch_xla_available, tqdm

    assert list(tqdm(range(3))) == [0, 1, 2] and is_torch_version(">=", "2.0")
    assert is_fp8_available() is False and is_torch_xla_available() in (True, False)


def test_skip_first_batches_and_prepare_data_loader_function():
    from trainkit.data_loader import prepare_data_loader, skip_first_batches

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    assert [b[0].tolist() for b in skip_first_batches(loader, 3)] == [[6.0, 7.0]]
    shard = prepare_data_loader(loader, num_processes=2, process_index=1)
    assert [b[0].tolist() for b in shard] == [[2.0, 3.0], [6.0, 7.0]]


def test_profile_runs_torch_profiler(tmp_path):
    from trainkit import Accelerator
    from trainkit.utils import ProfileKwargs

    accelerator = Accelerator(cpu=True)
    with accelerator.profile(ProfileKwargs(record_shapes=True, output_trace_dir=str(tmp_path))) as profiler:
        torch.ones(8, 8) @ torch.ones(8, 8)
    assert any("mm" in event.key for event in profiler.key_averages())
    assert (tmp_path / "trace_rank_0.json").exists()


def test_join_uneven_inputs_warns_on_several_processes_that_are_not_ddp():
    """CPU, no process group: with several FSDP processes join has no effect, said with a UserWarning carrying the
    phrase Accelerate's own scripts look for ("only supported for multi-GPU")."""
    from trainkit.engine.process.uneven import join_uneven_inputs
    from trainkit.utils import DistributedType

    with pytest.warns(UserWarning, match="join_uneven_inputs has no effect with FSDP.*only supported for multi-GPU"):
        with join_uneven_inputs(DistributedType.FSDP, [], []) as joined:
            assert joined is None


def test_join_uneven_inputs_says_it_changes_nothing_on_one_process(caplog):
    from trainkit import Accelerator

    accelerator = Accelerator(cpu=True)
    with caplog.at_level(logging.WARNING), accelerator.join_uneven_inputs([]):
        pass
    assert "join_uneven_inputs has effect only" in caplog.text
    with accelerator.trigger_sync_in_backward(nn.Linear(1, 1)):
        pass
    assert isinstance(accelerator.join_uneven_inputs([]), contextlib.AbstractContextManager)


def test_every_name_in_the_table_is_accelerates_too():
    """Keeps the table honest: each trainkit name mirrors a real Accelerate name at the matching path."""
    pytest.importorskip("accelerate", reason="accelerate is not installed (it comes with peft in the dev extra)")
    missing = []
    for module, names in PUBLIC_NAMES.items():
        accelerate_module = importlib.import_module(module.replace("trainkit", "accelerate", 1))
        missing += [f"{module}.{name}" for name in names if not hasattr(accelerate_module, name)]
    assert missing == []


def test_log_with_accepts_logger_type_members(tmp_path):
    from trainkit import Accelerator
    from trainkit.utils import LoggerType

    pytest.importorskip("tensorboard", reason="log_with='tensorboard' needs the optional tensorboard package")
    accelerator = Accelerator(cpu=True, log_with=LoggerType.TENSORBOARD, project_dir=str(tmp_path))
    assert accelerator.log_with == ["tensorboard"]
    with pytest.raises(Exception, match="comet_ml"):
        Accelerator(cpu=True, log_with=[LoggerType.COMETML])
