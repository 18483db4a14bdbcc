"""Accelerate's names for features trainkit does not drive: they exist, and using one says why it cannot run.

``NOT_DRIVEN`` maps each name to the reason; :func:`refusing_function` and :func:`refusing_class` build the
placeholder that raises ``NotImplementedError`` with that reason when called or constructed. Availability
predicates (``is_npu_available()``...) are not here: they answer False, as Accelerate does on a machine
without that hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

NOT_DRIVEN: dict[str, str] = {}

_MEGATRON = "trainkit does not drive Megatron-LM (use FSDP or DeepSpeed-style sharding through FSDP2)"
_XLA = "trainkit does not drive TPUs / torch_xla"
_FP8 = ("trainkit does not drive FP8 training (Transformer Engine, MS-AMP, torchao float8); "
        "use mixed_precision='bf16' or 'fp16'")
_BNB = "trainkit does not quantize models with bitsandbytes (load them quantized with transformers instead)"
_BIG_MODEL = ("trainkit does not do big-model inference (device maps, CPU/disk offload and dispatch); "
              "load and dispatch the model with transformers' device_map before or instead of trainkit")
_PARALLELISM = ("trainkit does not drive context or sequence parallelism; tensor parallelism is set with "
                "trainkit.ParallelismConfig(tp_size=...) alone (no handler or plugin objects; docs/parallelism.md)")
_SAGEMAKER = "trainkit does not launch on Amazon SageMaker"
_PIPPY = "trainkit does not drive pipeline-parallel inference (PiPPy)"
_LAUNCH = ("this is a helper of `accelerate launch`; trainkit's launcher (`trainkit launch`) builds its own "
           "torch.distributed.run command")
_FSDP1 = ("trainkit shards with FSDP2 and saves through Accelerator.save_state / save_model; "
          "Accelerate's FSDP helper functions for its own wrapping are not part of trainkit")

NOT_DRIVEN.update({name: _MEGATRON for name in (
    "MegatronLMDummyDataLoader", "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "T5TrainStep",
    "avg_losses_across_data_parallel_group", "add_model_config_to_megatron_parser", "parse_bert_config",
    "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config")})
NOT_DRIVEN.update({name: _MEGATRON for name in ("MegatronLMPlugin", "MegatronLMDummyScheduler")})
NOT_DRIVEN.update({name: _FP8 for name in ("FP8RecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "AORecipeKwargs")})
NOT_DRIVEN.update({name: _XLA for name in ("install_xla", "prepare_tpu")})
NOT_DRIVEN.update({name: _FP8 for name in (
    "apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "convert_model_to_fp8_ao",
    "has_transformer_engine_layers", "has_ao_layers", "filter_first_and_last_linear_layers", "torchao_required",
    "check_cuda_fp8_capability")})
NOT_DRIVEN.update({name: _BNB for name in (
    "BnbQuantizationConfig", "load_and_quantize_model", "has_4bit_bnb_layers", "get_quantized_model_device_map",
    "replace_with_bnb_layers", "get_keys_to_not_convert", "get_parameter_device", "quantize_and_offload_8bit")})
NOT_DRIVEN.update({name: _BIG_MODEL for name in (
    "cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model", "infer_auto_device_map",
    "load_checkpoint_and_dispatch", "OffloadedWeightsLoader", "PrefixedDataset",
    "attach_layerwise_casting_hooks", "get_state_dict_from_offload",
    "get_state_dict_offloaded_model", "clean_device_map", "check_device_same", "get_non_persistent_buffers",
    "compute_module_total_buffer_size", "get_module_leaves", "get_module_size_with_ties", "fallback_allocate",
    # accelerate.hooks: the module hooks big-model inference dispatches with
    "ModelHook", "SequentialHook", "add_hook_to_module", "remove_hook_from_module", "AlignDevicesHook",
    "attach_execution_device_hook", "attach_align_device_hook", "remove_hook_from_submodules",
    "attach_align_device_hook_on_blocks", "CpuOffload", "UserCpuOffloadHook", "LayerwiseCastingHook",
    "check_device_map", "get_balanced_memory", "get_max_memory", "offload_state_dict", "offload_weight",
    "load_offloaded_weight", "load_offloaded_weights", "save_offload_index", "has_offloaded_params",
    "align_module_device", "calculate_maximum_sizes", "get_max_layer_size", "check_tied_parameters_on_same_device",
    "check_tied_parameters_in_config", "get_mixed_precision_context_manager", "set_module_tensor_to_device")})
NOT_DRIVEN.update({name: _PARALLELISM for name in (
    "TorchTensorParallelPlugin", "TorchTensorParallelConfig", "TorchContextParallelConfig",
    "DeepSpeedSequenceParallelConfig")})
NOT_DRIVEN.update({name: _SAGEMAKER for name in ("prepare_sagemager_args_inputs",)})
NOT_DRIVEN.update({name: _PIPPY for name in ("prepare_pippy",)})
NOT_DRIVEN.update({name: _LAUNCH for name in (
    "PrepareForLaunch", "prepare_multi_gpu_env", "prepare_deepspeed_cmd_env", "prepare_simple_launcher_cmd_env",
    "set_numa_affinity", "setup_fp8_env", "prepare_extend_env_parallelism_config", "env_var_path_add")})
NOT_DRIVEN.update({name: _FSDP1 for name in (
    "save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer", "fsdp2_apply_ac",
    "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict", "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler", "compile_regions_fsdp2",
    "enable_fsdp_ram_efficient_loading", "disable_fsdp_ram_efficient_loading", "ensure_weights_retied")})
NOT_DRIVEN.update({
    "write_basic_config": "trainkit writes its launch config from the command line: `trainkit config --default` "
                          "(the same YAML keys as Accelerate's)",
    "merge_fsdp_weights": "trainkit merges its own sharded checkpoints from the command line: "
                          "`trainkit merge-weights CHECKPOINT OUTPUT`",
})
NOT_DRIVEN.update({
    f"{product}Tracker": f"trainkit has no built-in {product} tracker; subclass trainkit.tracking.GeneralTracker "
                         "and pass an instance in log_with (or register it with register_tracker_class)"
    for product in ("Aim", "ClearML", "CometML", "DVCLive", "SwanLab", "Trackio")})


def _refuse(name: str) -> NoReturn:
    raise NotImplementedError(f"{name}: {NOT_DRIVEN[name]}.")


def refusing_function(name: str) -> Any:
    """A function named ``name`` that raises ``NotImplementedError`` with the reason trainkit cannot run it."""

    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(name)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not available in trainkit: {NOT_DRIVEN[name]}."
    return refused


def refusing_class(name: str) -> type:
    """A class named ``name`` whose construction raises ``NotImplementedError`` with the reason."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _refuse(name)

    return type(name, (), {"__init__": __init__, "__doc__": f"Not available in trainkit: {NOT_DRIVEN[name]}.",
                           "__module__": __name__})


def placeholder(name: str) -> Any:
    """The placeholder for a name of :data:`NOT_DRIVEN`: a class for a capitalised name, else a function."""
    return refusing_class(name) if name[:1].isupper() else refusing_function(name)


def refusing_module(module_name: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of an Accelerate module path whose ``names`` are all features trainkit does not
    drive (``trainkit.hooks`` for ``accelerate.hooks``...): each name is a placeholder built on first use, so
    ``from accelerate.hooks import ModelHook`` imports and only using it raises, with the reason."""
    unknown = [name for name in names if name not in NOT_DRIVEN]
    if unknown:
        raise AssertionError(f"{module_name}: no reason recorded for {unknown}")
    placeholders: dict[str, Any] = {}

    def module_getattr(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return placeholders.setdefault(name, placeholder(name))

    return module_getattr
