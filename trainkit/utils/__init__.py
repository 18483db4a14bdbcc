"""Helpers that training scripts import: the training-related names of ``accelerate.utils``.

Plain data (enums, dataclasses, availability checks) is imported here directly; names that need the
engine (collectives, the process state) load on first use, so importing a dataclass from
``trainkit.utils`` never drags the engine in.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainkit.config.deepspeed import DeepSpeedPlugin
from trainkit.config.dynamo import TorchDynamoPlugin

from . import constants as _constants
from . import imports as _imports
from .dataclasses import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MegatronLMDummyScheduler,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
)
from .enums import (
    ComputeEnvironment,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from .environment import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    check_os_kernel,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_current_device_type,
    get_gpu_info,
    get_grad_scaler,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from .memory import find_executable_batch_size, release_memory
from .other import (
    compile_regions,
    compile_regions_deepspeed,
    convert_bytes,
    deepspeed_required,
    get_model_tp_size,
    get_pretty_name,
    is_peft_model,
    is_port_in_use,
    merge_dicts,
    recursive_getattr,
)
from .progress import tqdm
from .random import set_seed, synchronize_rng_state, synchronize_rng_states
from .versions import compare_versions

_AVAILABILITY = {name: getattr(_imports, name) for name in dir(_imports) if name.startswith("is_")}
globals().update(_AVAILABILITY)
_CONSTANTS = {name: getattr(_constants, name) for name in dir(_constants) if name.isupper()}
globals().update(_CONSTANTS)

_LAZY = {
    "FullyShardedDataParallelPlugin": "trainkit.engine.strategies.fsdp.plugin",
    "ParallelismConfig": "trainkit.parallelism_config",
    **{name: "trainkit.config.parallelism" for name in ("TorchContextParallelConfig", "DeepSpeedSequenceParallelConfig")},
    "init_empty_weights": "trainkit.utils.modeling",
    "init_on_device": "trainkit.utils.modeling",
    "skip_first_batches": "trainkit.data_loader",
    "load_checkpoint_in_model": "trainkit.engine.inference.loading",
    # Accelerate's DeepSpeed placeholders live with the engine (they need torch).
    "DummyOptim": "trainkit.engine.deepspeed.from_config",
    "DummyScheduler": "trainkit.engine.deepspeed.from_config",
    **{name: "trainkit.utils.model_tensors" for name in (
        "CustomDtype", "clean_state_dict_for_safetensors", "compute_module_sizes", "convert_file_size_to_int",
        "dtype_byte_size", "extract_submodules_state_dict", "find_tied_parameters", "get_module_children_bottom_up",
        "id_tensor_storage", "load", "load_state_dict", "model_has_dtensor", "named_module_tensors",
        "retie_parameters", "get_non_persistent_buffers", "compute_module_total_buffer_size")},
    "set_module_tensor_to_device": "trainkit.utils.tensor_placement",
    # big-model inference: planning device maps
    **{name: "trainkit.engine.inference.device_map" for name in (
        "check_device_map", "check_tied_parameters_in_config", "check_tied_parameters_on_same_device",
        "clean_device_map", "infer_auto_device_map")},
    **{name: "trainkit.engine.inference.memory_budget" for name in ("get_balanced_memory", "get_max_memory")},
    **{name: "trainkit.engine.inference.layer_sizes" for name in ("calculate_maximum_sizes", "get_max_layer_size")},
    # big-model inference runtime (trainkit.engine.inference)
    **{name: "trainkit.engine.inference.align" for name in (
        "align_module_device", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
        "has_offloaded_params")},
    **{name: "trainkit.engine.inference.offload" for name in (
        "OffloadedWeightsLoader", "PrefixedDataset", "load_offloaded_weight", "load_offloaded_weights",
        "offload_state_dict", "offload_weight", "save_offload_index")},

    "prepare_simple_launcher_cmd_env": "trainkit.utils.launch",  # trainkit launch's own step (trainkit.cli.launch_steps)
    "is_compiled_module": "trainkit.engine.step.unwrapping",
    "has_compiled_regions": "trainkit.engine.step.unwrapping",
    **{name: "trainkit.utils.operations" for name in (
        "CannotPadNestedTensorWarning", "ConvertOutputsToFp32", "DistributedOperationException", "GatheredParameters",
        "TensorInformation", "broadcast", "broadcast_object_list", "chained_operation", "concatenate",
        "convert_outputs_to_fp32", "convert_to_fp32", "copy_tensor_to_devices", "extract_model_from_parallel",
        "find_batch_size", "find_device", "gather", "gather_object", "gather_tensor_shape", "get_data_structure",
        "honor_type", "ignorant_find_batch_size", "initialize_tensors", "is_namedtuple", "is_tensor_information",
        "is_torch_tensor", "listify", "pad_across_processes", "pad_input_tensors", "recursively_apply", "reduce",
        "save", "send_to_device", "slice_tensors", "verify_operation", "wait_for_everyone")},
}

__all__ = sorted([
    "AORecipeKwargs", "AutocastKwargs", "ComputeEnvironment", "DDPCommunicationHookType", "DataLoaderConfiguration",
    "DeepSpeedPlugin", "DistributedDataParallelKwargs", "DistributedType",
    "DynamoBackend", "FP8BackendType", "FP8RecipeKwargs", "GradScalerKwargs", "GradientAccumulationPlugin",
    "InitProcessGroupKwargs", "KwargsHandler", "LoggerType", "MSAMPRecipeKwargs", "MegatronLMDummyScheduler",
    "MegatronLMPlugin", "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType",
    "SageMakerDistributedType", "TERecipeKwargs", "TorchDynamoPlugin", "find_executable_batch_size",
    "release_memory", "set_seed", "synchronize_rng_state", "are_libraries_initialized", "check_os_kernel",
    "check_cuda_p2p_ib_support", "get_cpu_distributed_information", "get_gpu_info", "get_grad_scaler",
    "clear_environment", "compare_versions", "compile_regions", "compile_regions_deepspeed", "convert_bytes",
    "convert_dict_to_env_variables", "deepspeed_required", "get_current_device_type", "get_int_from_env",
    "get_model_tp_size", "get_pretty_name", "is_peft_model", "is_port_in_use", "merge_dicts", "parse_choice_from_env",
    "parse_flag_from_env", "patch_environment", "purge_accelerate_environment", "recursive_getattr", "str_to_bool", "synchronize_rng_states", "tqdm", *_AVAILABILITY,
    *_CONSTANTS, *_LAZY,
])


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        from trainkit.utils.unsupported import NOT_DRIVEN, placeholder  # names of features trainkit does not drive

        if name in NOT_DRIVEN:
            globals()[name] = placeholder(name)
            return globals()[name]
        raise AttributeError(f"module 'trainkit.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
