"""Accelerate API behaviours a user hit as gaps (issue 23): unwrap_model's compile option, the state resets,
a settable distributed_type, reduce's reductions, synchronize_rng_states, the checkpoint file-name constants.

CPU, one process, except :func:`test_collectives_and_rng_sync_on_two_gloo_ranks` (2 gloo ranks on CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed import run_torchrun
from trainkit import Accelerator
from trainkit.engine.process.state import ProcessState
from trainkit.state import AcceleratorState, GradientState, PartialState

WORKER = Path(__file__).parent / "workers" / "api_fix_checks.py"


@pytest.fixture(autouse=True)
def _fresh_state():
    yield
    ProcessState.reset()


def test_unwrap_model_keeps_a_compile_wrapper_unless_told_not_to():
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    prepared = accelerator.prepare(torch.compile(model))
    kept = accelerator.unwrap_model(prepared)  # keep_torch_compile=True is Accelerate's default
    assert kept is prepared and kept._orig_mod is model
    assert accelerator.unwrap_model(prepared, keep_torch_compile=None) is model  # None and False drop it
    assert accelerator.unwrap_model(prepared, keep_torch_compile=False) is model
    assert accelerator.unwrap_model(model, keep_fp32_wrapper=False, keep_torch_compile=False) is model


def test_unwrap_model_keep_fp32_wrapper_false_restores_the_original_forward():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(nn.Linear(2, 2))
    assert getattr(model.forward, "__func__", None) is not nn.Linear.forward  # the autocast forward
    inner = accelerator.unwrap_model(model, keep_fp32_wrapper=False, keep_torch_compile=None)
    assert inner.forward.__func__ is nn.Linear.forward
    assert inner(torch.ones(1, 2)).grad_fn.name() == "AddmmBackward0"  # plain fp32 matmul, no autocast cast


def test_prepare_after_accelerator_state_reset_raises_until_a_new_accelerator():
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"_reset_state\(\)` was called") as raised:
        accelerator.prepare(nn.Linear(2, 2))
    # The phrases `accelerate test` (Accelerate's own setup check) looks for in this message.
    message = str(raised.value.args[0])
    assert "`AcceleratorState` object has no attribute" in message
    assert "This happens if `AcceleratorState._reset_state()`" in message
    with pytest.raises(AttributeError, match="distributed_type"):
        _ = accelerator.distributed_type
    Accelerator(cpu=True)  # re-creates the state, as in Accelerate: the old Accelerator works again
    assert isinstance(accelerator.prepare(nn.Linear(2, 2)), nn.Linear)


def test_full_reset_forgets_the_process_state():
    first = PartialState(cpu=True)
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(AttributeError, match="AcceleratorState"):
        accelerator.prepare(nn.Linear(2, 2))
    assert PartialState(cpu=True) is not first
    PartialState._reset_state()
    assert ProcessState._instance is None


def test_gradient_state_reset_gives_a_fresh_state():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    assert GradientState() is accelerator.gradient_state
    GradientState._reset_state()
    fresh = GradientState()
    assert fresh is not accelerator.gradient_state and fresh.sync_gradients
    second = Accelerator(cpu=True)
    assert GradientState() is second.gradient_state


def test_gradient_state_plugin_kwargs_are_accelerates():
    """``num_steps`` and the plugin fields given with other than their defaults, as Accelerate 1.15 answers (the
    values below are its answers); transformers' Trainer reads ``sync_each_batch`` there."""
    from trainkit.utils import GradientAccumulationPlugin

    assert Accelerator(cpu=True).gradient_state.plugin_kwargs == {"num_steps": 1}
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 4}
    accelerator.gradient_accumulation_steps = 5
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 5}
    plugin = GradientAccumulationPlugin(num_steps=2, sync_each_batch=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 2, "sync_each_batch": True}
    accelerator.free_memory()
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 2, "sync_each_batch": True}
    GradientState._reset_state()
    assert GradientState(GradientAccumulationPlugin(num_steps=3, adjust_scheduler=False)).plugin_kwargs == {
        "num_steps": 3, "adjust_scheduler": False}


def test_distributed_type_is_settable_and_validated():
    accelerator = Accelerator(cpu=True)
    state = AcceleratorState()
    state.distributed_type = "MULTI_GPU"
    from trainkit.utils import DistributedType

    assert state.distributed_type is DistributedType.MULTI_GPU
    assert accelerator.distributed_type is DistributedType.MULTI_GPU and PartialState().distributed_type == "MULTI_GPU"
    with pytest.raises(ValueError, match="MULTI_CPU"):
        state.distributed_type = "MULTI_TPU"


def test_reduce_accepts_accelerates_reductions_and_names_them_on_bad_input():
    accelerator = Accelerator(cpu=True)
    tensor = torch.tensor([1.0, 2.0])
    for reduction in ("sum", "mean", "max", "none"):
        assert accelerator.reduce(tensor, reduction=reduction).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="'max'"):
        accelerator.reduce(tensor, reduction="product")


def test_checkpoint_file_names_match_what_save_model_writes(tmp_path):
    from trainkit.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME

    accelerator = Accelerator(cpu=True)
    accelerator.save_model(accelerator.prepare(nn.Linear(2, 2)), tmp_path)
    assert (tmp_path / SAFE_WEIGHTS_NAME).is_file()
    assert SAFE_WEIGHTS_INDEX_NAME == SAFE_WEIGHTS_NAME + ".index.json" and WEIGHTS_NAME.endswith(".bin")


def test_synchronize_rng_states_on_one_process_keeps_the_state():
    from trainkit.utils import synchronize_rng_states

    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    assert torch.equal(torch.rand(2), expected)
    with pytest.raises(ValueError, match="generator"):
        synchronize_rng_states(["generator"])
    with pytest.raises(NotImplementedError, match="NPU"):
        synchronize_rng_states(["npu"])


def test_an_accelerator_pickles_and_deep_copies_with_the_process_state():
    """Accelerate's test_distributed_data_loop pickles a prepared Accelerator (CPU, one process): the copy shares
    this process's state (one per process) and carries the resolved configuration and prepared loaders."""
    import copy
    import pickle

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.utils.data.DataLoader(list(range(6)), batch_size=2))
    restored = pickle.loads(pickle.dumps(accelerator))
    assert restored.state.__dict__ is accelerator.state.__dict__ and type(restored.state) is type(accelerator.state)
    assert restored.config == accelerator.config
    assert dict(restored.config.provenance) == dict(accelerator.config.provenance)
    with pytest.raises(TypeError):  # still read-only after the round trip
        restored.config.provenance["mixed_precision"] = "x"  # type: ignore[index]
    assert [batch.tolist() for batch in restored._dataloaders[0]] == [[0, 1], [2, 3], [4, 5]]
    assert copy.deepcopy(accelerator.config) == accelerator.config


@pytest.mark.multiprocess
def test_collectives_and_rng_sync_on_two_gloo_ranks(tmp_path):
    run_torchrun(WORKER, tmp_path, nproc=2, timeout=300)
    r0, r1 = (json.loads((tmp_path / f"report_rank{r}.json").read_text()) for r in range(2))
    for rank, report in enumerate((r0, r1)):
        assert report["world"] == 2
        assert report["accelerator_sum"] == [3.0, 7.0] and report["accelerator_mean"] == [1.5, 3.5]
        assert report["accelerator_max"] == [2.0, 5.0] and report["utils_default"] == [1.5, 3.5]
        assert "'max'" in report["bad_reduction"] and report["debug"] is True
        assert "shapes differ" in report["mismatch"] and report["held_shape"] == [3, 2]
        # sampler=BatchSampler(...), batch_size=None: each rank gets whole index lists (2 of the 4 lists of 3 that
        # cover 10 indices, the last one filled up from the start); together they hold every index.
        assert [len(batch) for batch in report["batched_sampler_batches"]] == [3, 3]
        assert len(report["batched_sampler_all"]) == 12 and set(report["batched_sampler_all"]) == set(range(10))
        assert report["full_last_batch_kept"] == [0, [0.0] * 4 + [1.0] * 4]
        # As in Accelerate, a different folder on each rank works: each rank keeps its part in its own folder.
        assert f"random_states_{rank}.json" in report["per_rank_folders"], report["per_rank_folders"]
        assert "manifest.json" in report["per_rank_folders"]
    assert not set(sum(r0["batched_sampler_batches"], [])) & set(r1["batched_sampler_batches"][0])
    assert r0["accelerator_none"] == [1.0, 5.0] and r1["accelerator_none"] == [2.0, 2.0]
    assert r0["before"][0] != r1["before"][0] and r0["before"][1] != r1["before"][1]
    assert r0["after"] == r1["after"]  # both generators now follow rank 0's state


def test_state_pre_hooks_see_the_models_and_write_into_the_checkpoint(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 2))
    seen: dict = {}

    def save_hook(models, weights, output_dir):
        seen["saved"] = (len(models), sorted(weights[0]))
        Path(output_dir, "extra.json").write_text("{}")

    handle = accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(lambda models, input_dir: seen.setdefault("loaded", input_dir))
    folder = accelerator.save_state(tmp_path / "ckpt")
    assert seen["saved"] == (1, ["bias", "weight"]) and (Path(folder) / "extra.json").is_file()
    accelerator.load_state(folder)
    assert seen["loaded"] == folder
    handle.remove()
    seen.clear()
    accelerator.save_state(tmp_path / "ckpt")
    assert "saved" not in seen

    # Hooks that save a model in their own format take it out of the lists (diffusers', PEFT's): the checkpoint
    # still restores it (trainkit writes every prepared model).
    def own_format_save(models, weights, output_dir):
        torch.save(weights.pop(), Path(output_dir, "own_format.bin"))
        models.pop()

    accelerator.register_save_state_pre_hook(own_format_save)
    accelerator.register_load_state_pre_hook(lambda models, input_dir: models.pop())
    saved = {key: value.clone() for key, value in model.state_dict().items()}
    folder = accelerator.save_state(tmp_path / "other")
    assert Path(folder, "own_format.bin").is_file()
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.load_state(folder)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0)


def test_accelerator_attributes_under_accelerates_names():
    from trainkit.utils import DataLoaderConfiguration, ProjectConfiguration

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(non_blocking=True),
                              project_config=ProjectConfiguration(iteration=3))
    assert accelerator.non_blocking is True and accelerator.use_stateful_dataloader is False
    assert accelerator.save_iteration == 3 and accelerator.should_save_model is True
    assert accelerator.is_fsdp2 is False and accelerator.multi_device is False
    assert accelerator.parallelism_config is None and accelerator.torch_device_mesh is None
    ran = []
    accelerator.on_local_process(lambda: ran.append("local0"), local_process_index=0)()
    accelerator.on_process(process_index=1)(lambda: ran.append("p1"))()
    accelerator.on_main_process()(lambda: ran.append("main"))()
    assert ran == ["local0", "main"]
    with pytest.raises(ValueError, match="process_index"):
        accelerator.on_process(lambda: None)
    with accelerator.maybe_context_parallel():
        pass
    model = nn.Linear(2, 2)
    assert accelerator.verify_device_map(model) is False
    model.hf_device_map = {"a": 0, "b": "cpu"}
    assert accelerator.verify_device_map(model) is True
    with pytest.raises(RuntimeError, match="process_index"):
        _ = accelerator.data_parallel_rank


def test_parallelism_arguments_trainkit_does_not_drive_are_refused():
    with pytest.raises(NotImplementedError, match="deepspeed_plugins"):
        Accelerator(cpu=True, deepspeed_plugins=object())
    with pytest.raises(ValueError, match="parallelism_config must be a ParallelismConfig"):
        Accelerator(cpu=True, parallelism_config=object())


def test_parallelism_config_on_one_process():
    """CPU, one process: every degree 1, ranks 0, no mesh (Accelerate builds none either)."""
    from trainkit import ParallelismConfig

    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig())
    assert accelerator.parallelism_config.total_size == 1 and accelerator.torch_device_mesh is None
    assert accelerator.data_parallel_rank == accelerator.data_parallel_shard_rank == accelerator.tensor_parallel_rank == 0
    assert accelerator.distributed_type.value == "NO"


def test_state_module_helpers():
    from trainkit.state import ThreadLocalSharedDict, do_nothing, is_initialized

    AcceleratorState._reset_state(reset_partial_state=True)
    assert is_initialized() is False
    accelerator = Accelerator(cpu=True)  # held: the state lives as long as an accelerator does
    assert is_initialized() is True and accelerator.is_main_process and do_nothing(1, key=2) is None
    AcceleratorState._reset_state()
    assert is_initialized() is False

    class Shared:
        state = ThreadLocalSharedDict()

    first, second = Shared(), Shared()
    first.state["key"] = 1
    assert second.state == {"key": 1} and Shared.state is first.state


def test_state_deepspeed_plugin_lookup_and_fsdp2_flag():
    from trainkit.utils import DeepSpeedPlugin

    state = Accelerator(cpu=True).state
    assert state.is_fsdp2 is False and state.deepspeed_plugins == {}
    with pytest.raises(ValueError, match="DeepSpeed config"):
        state.get_deepspeed_plugin("default")
    plugin = DeepSpeedPlugin(zero_stage=0)
    Accelerator(cpu=True, deepspeed_plugin=plugin)
    assert AcceleratorState().get_deepspeed_plugin("default") is plugin
    AcceleratorState().select_deepspeed_plugin()
    with pytest.raises(KeyError, match="other"):
        AcceleratorState().select_deepspeed_plugin("other")


def test_gradient_state_answers_accelerates_attributes():
    from torch.utils.data import DataLoader

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    state = GradientState()
    assert state.num_steps == 2 and state.sync_with_dataloader and state.initialized
    assert state.is_xla_gradients_synced is False and state.dataloader_references == [None]
    loader = accelerator.prepare(DataLoader(list(range(4)), batch_size=2))
    for _ in loader:
        assert state.dataloader_references == [None, loader]
    assert state.dataloader_references == [None]


@pytest.mark.parametrize("options", [{}, {"gradient_accumulation_steps": 4},
                                     {"plugin": {"num_steps": 2}}, {"plugin": {"num_steps": 2, "adjust_scheduler": True}},
                                     {"plugin": {"num_steps": 2, "adjust_scheduler": False}}])
def test_adjust_scheduler_reads_false_as_accelerates_does(options):
    """Accelerate 1.15 reports False in each of these cases, before and after prepare (its GradientState reads the
    option from the plugin's non-default fields only, so the default True never shows)."""
    from trainkit.utils import GradientAccumulationPlugin

    plugin = options.pop("plugin", None)
    accelerator = Accelerator(cpu=True, **options, **(
        {"gradient_accumulation_plugin": GradientAccumulationPlugin(**plugin)} if plugin else {}))
    assert accelerator.gradient_state.adjust_scheduler is False and GradientState().adjust_scheduler is False
    accelerator.prepare(nn.Linear(2, 2))
    assert accelerator.gradient_state.adjust_scheduler is False


def test_a_gradient_state_made_before_any_accelerator_names_only_the_plugins_given_fields():
    """Accelerate's ``GradientState()`` without an Accelerator: ``plugin_kwargs`` is the plugin's ``to_kwargs()``."""
    from trainkit.utils import GradientAccumulationPlugin

    assert GradientState().plugin_kwargs == {} and GradientState().num_steps == 1
    assert GradientState(GradientAccumulationPlugin()).plugin_kwargs == {}
    assert GradientState(GradientAccumulationPlugin(num_steps=3)).plugin_kwargs == {"num_steps": 3}
    assert GradientState().adjust_scheduler is False


def test_scheduler_steps_only_on_optimizer_steps_under_accumulation():
    """10 micro-batches, 4 per optimizer step, LambdaLR 1/(1+s): the learning rates and the scheduler's state are
    those Accelerate 1.15 gives on the same script (3 optimizer steps: its step count is not advanced in between)."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    loader = torch.utils.data.DataLoader(torch.randn(10, 4), batch_size=1)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    rates = []
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(batch).pow(2).mean())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            rates.append(scheduler.get_last_lr()[0])
    assert rates == pytest.approx([1, 1, 1, 1 / 2, 1 / 2, 1 / 2, 1 / 2, 1 / 3, 1 / 3, 1 / 4], abs=1e-12)
    state = scheduler.state_dict()
    assert (state["last_epoch"], state["_step_count"]) == (3, 4)


def test_dataclasses_module_names():
    from trainkit.utils import dataclasses as tk_dataclasses
    from trainkit.utils.enums import LoggerType

    assert isinstance(LoggerType, tk_dataclasses.EnumWithContains) and issubclass(LoggerType, tk_dataclasses.BaseEnum)
    model = nn.Sequential(nn.Linear(1, 1), nn.Sequential(nn.ReLU()))
    assert tk_dataclasses.get_module_class_from_name(model, "ReLU") is nn.ReLU
    assert tk_dataclasses.get_module_class_from_name(model, "Conv2d") is None
    from trainkit import FullyShardedDataParallelPlugin

    assert tk_dataclasses.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin


@pytest.mark.multiprocess
def test_notebook_launcher_takes_accelerates_rendezvous_arguments(monkeypatch):
    from tests.engine.workers.launched_function import rank_sum
    from trainkit import notebook_launcher

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # 2 CPU processes with gloo
    results = notebook_launcher(rank_sum, (10,), num_processes=2, rdzv_backend="static", rdzv_id="tk-test",
                                monitor_interval=0.05, max_restarts=0)
    assert results == {0: (0, 2, 21.0), 1: (1, 2, 21.0)}
    with pytest.raises(ValueError, match="etcd"):
        notebook_launcher(rank_sum, (0,), num_processes=2, rdzv_backend="etcd")


def test_plugin_defaults_left_unset_mean_accelerates_defaults():
    from trainkit.utils import DeepSpeedPlugin, TorchDynamoPlugin

    plugin = TorchDynamoPlugin()  # backend/fullgraph/use_regional_compilation default to None, as in Accelerate
    assert (plugin.backend, plugin.fullgraph, plugin.use_regional_compilation, plugin.enabled) == ("no", False, False,
                                                                                                   False)
    assert TorchDynamoPlugin(backend="EAGER", fullgraph=True).compile_kwargs()["fullgraph"] is True
    assert DeepSpeedPlugin(zero_stage=0).enable_msamp is None
