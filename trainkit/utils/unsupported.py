"""Accelerate's names for features trainkit does not drive: they exist, and using one says why it cannot run.

``NOT_DRIVEN`` maps each name to the reason; :func:`refusing_function` and :func:`refusing_class` build the
placeholder that raises ``NotImplementedError`` with that reason when called or constructed, and carries
Accelerate's parameters (``ACCELERATE_SIGNATURES``: names, kinds and defaults), so a call written for Accelerate
reaches the refusal, not a ``TypeError``, and introspection sees Accelerate's signature
(tests/engine/test_accelerate_signatures.py compares them with the installed Accelerate). Availability
predicates (``is_npu_available()``...) are not here: they answer False, as Accelerate does on a machine
without that hardware.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any, NoReturn

NOT_DRIVEN: dict[str, str] = {}

_MEGATRON = "trainkit does not drive Megatron-LM (use FSDP or DeepSpeed-style sharding through FSDP2)"
_XLA = "trainkit does not drive TPUs / torch_xla"
_FP8 = ("trainkit does not drive FP8 training (Transformer Engine, MS-AMP, torchao float8); "
        "use mixed_precision='bf16' or 'fp16'")
_BNB = "trainkit does not quantize models with bitsandbytes (load them quantized with transformers instead)"
_PARALLELISM = ("tensor parallelism is set with trainkit.ParallelismConfig(tp_size=...) alone (no handler or plugin "
                "objects; docs/parallelism.md)")
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
NOT_DRIVEN["get_mixed_precision_context_manager"] = (
    "Accelerate's internal autocast helper; use `with accelerator.autocast():` (the Accelerator's mixed precision)")
NOT_DRIVEN.update({name: _PARALLELISM for name in (
    "TorchTensorParallelPlugin", "TorchTensorParallelConfig")})
NOT_DRIVEN.update({name: _SAGEMAKER for name in ("prepare_sagemager_args_inputs",)})
NOT_DRIVEN.update({name: _PIPPY for name in ("prepare_pippy",)})
NOT_DRIVEN.update({name: _LAUNCH for name in (
    "PrepareForLaunch", "prepare_multi_gpu_env", "prepare_deepspeed_cmd_env",
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

# Accelerate's parameters of each name above (annotations left out). write_basic_config's save_location defaults to
# a path under the machine's Hugging Face cache in Accelerate; here to None (the call is refused before any use).
ACCELERATE_SIGNATURES: dict[str, str] = {
    "AORecipeKwargs": "config=None, module_filter_func=None, pad_inner_dim=None, enable_fsdp_float8_all_gather=None",
    "AbstractTrainStep": "name",
    "AimTracker": "run_name, logging_dir='.', **kwargs",
    "BertTrainStep": "accelerator, args",
    "BnbQuantizationConfig": (
        "load_in_8bit=False, llm_int8_threshold=6.0, load_in_4bit=False, bnb_4bit_quant_type='fp4', "
        "bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype='fp16', torch_dtype=None, skip_modules=None,"
        " keep_in_fp32_modules=None"
    ),
    "ClearMLTracker": "run_name=None, **kwargs",
    "CometMLTracker": "run_name, **kwargs",
    "DVCLiveTracker": "run_name=None, live=None, **kwargs",
    "DeepSpeedSequenceParallelConfig": (
        "sp_seq_length=None, sp_seq_length_is_variable=None, sp_attn_implementation=None"
    ),
    "FP8RecipeKwargs": (
        "opt_level=None, use_autocast_during_eval=None, margin=None, interval=None, fp8_format=None, "
        "amax_history_len=None, amax_compute_algo=None, override_linear_precision=None, "
        "use_mxfp8_block_scaling=None, backend=None"
    ),
    "GPTTrainStep": "accelerator, args",
    "MSAMPRecipeKwargs": "opt_level=None",
    "MegatronLMDummyDataLoader": "**dataset_kwargs",
    "MegatronLMDummyScheduler": "optimizer, total_num_steps=None, warmup_num_steps=0, **kwargs",
    "MegatronLMPlugin": (
        "tp_degree=None, pp_degree=None, use_custom_fsdp=None, overlap_cpu_optimizer_d2h_h2d=None, "
        "no_load_optim=None, eod_mask_loss=None, no_save_optim=None, optimizer_cpu_offload=None, "
        "use_precision_aware_optimizer=None, decoder_last_pipeline_num_layers=None, "
        "recompute_granularity=None, recompute_method=None, recompute_num_layers=None, "
        "attention_backend=None, expert_model_parallel_size=None, context_parallel_size=None, "
        "attention_dropout=None, hidden_dropout=None, attention_softmax_in_fp32=None, "
        "expert_tensor_parallel_size=None, calculate_per_token_loss=None, "
        "use_rotary_position_embeddings=None, num_micro_batches=None, gradient_clipping=None, "
        "sequence_parallelism=None, recompute_activations=None, use_distributed_optimizer=None, "
        "pipeline_model_parallel_split_rank=None, num_layers_per_virtual_pipeline_stage=None, "
        "is_train_batch_min=True, train_iters=None, train_samples=None, weight_decay_incr_style='constant', "
        "start_weight_decay=None, end_weight_decay=None, lr_decay_style='linear', lr_decay_iters=None, "
        "lr_decay_samples=None, lr_warmup_iters=None, lr_warmup_samples=None, lr_warmup_fraction=None, "
        "min_lr=0, consumed_samples=None, no_wd_decay_cond=None, scale_lr_cond=None, lr_mult=1.0, "
        "megatron_dataset_flag=False, seq_length=None, encoder_seq_length=None, decoder_seq_length=None, "
        "tensorboard_dir=None, set_all_logging_options=False, eval_iters=100, eval_interval=1000, "
        "return_logits=False, custom_train_step_class=None, custom_train_step_kwargs=None, "
        "custom_model_provider_function=None, custom_prepare_model_function=None, "
        "custom_megatron_datasets_provider_function=None, custom_get_batch_function=None, "
        "custom_loss_function=None, other_megatron_args=None"
    ),
    "PrepareForLaunch": "launcher, distributed_type='NO', debug=False",
    "SwanLabTracker": "run_name, **kwargs",
    "T5TrainStep": "accelerator, args",
    "TERecipeKwargs": (
        "use_autocast_during_eval=None, margin=None, interval=None, fp8_format=None, amax_history_len=None, "
        "amax_compute_algo=None, override_linear_precision=None, use_mxfp8_block_scaling=None"
    ),
    "TorchContextParallelConfig": "cp_comm_strategy=None",
    "TorchTensorParallelConfig": "enable_async_tp=False",
    "TorchTensorParallelPlugin": "tp_size=1, torch_device_mesh=None",
    "TrackioTracker": "run_name, **kwargs",
    "add_model_config_to_megatron_parser": "model_type",
    "apply_fp8_autowrap": "model, fp8_recipe_handler",
    "avg_losses_across_data_parallel_group": "losses",
    "check_cuda_fp8_capability": "",
    "compile_regions_fsdp2": "module, **compile_kwargs",
    "contextual_fp8_autocast": "model_forward, fp8_recipe, use_during_eval=False",
    "convert_model": "model, to_transformer_engine=True, _convert_linear=True, _convert_ln=True",
    "convert_model_to_fp8_ao": "model, config=None, module_filter_func=None",
    "disable_fsdp_ram_efficient_loading": "",
    "enable_fsdp_ram_efficient_loading": "",
    "ensure_weights_retied": "param_init_fn, model, device",
    "filter_first_and_last_linear_layers": "module, fqn",
    "fsdp2_apply_ac": "accelerator, model",
    "fsdp2_canonicalize_names": "named_params",
    "fsdp2_load_full_state_dict": "accelerator, model, full_sd, cpu_offload=False",
    "fsdp2_prepare_model": "accelerator, model",
    "fsdp2_switch_optimizer_parameters": "optimizer, mapping",
    "get_fsdp2_grad_scaler": "**kwargs",
    "get_mixed_precision_context_manager": "native_amp=False, autocast_kwargs=None",
    "has_4bit_bnb_layers": "model",
    "has_ao_layers": "model",
    "has_transformer_engine_layers": "model",
    "install_xla": "upgrade=False",
    "load_and_quantize_model": (
        "model, bnb_quantization_config, weights_location=None, device_map=None, "
        "no_split_module_classes=None, max_memory=None, offload_folder=None, offload_state_dict=False"
    ),
    "load_fsdp_model": "fsdp_plugin, accelerator, model, input_dir, model_index=0, adapter_only=False, use_dcp=True",
    "load_fsdp_optimizer": (
        "fsdp_plugin, accelerator, optimizer, model, input_dir, optimizer_index=0, adapter_only=False, "
        "use_dcp=True"
    ),
    "merge_fsdp_weights": "checkpoint_dir, output_path, safe_serialization=True, remove_checkpoint_dir=False",
    "parse_bert_config": "megatron_lm_plugin, model, batch_data",
    "parse_glm4_moe_config": "megatron_lm_plugin, model, batch_data",
    "parse_gpt2_config": "megatron_lm_plugin, model, batch_data",
    "parse_llama_config": "megatron_lm_plugin, model, batch_data",
    "parse_t5_config": "megatron_lm_plugin, model, batch_data",
    "prepare_deepspeed_cmd_env": "args",
    "prepare_multi_gpu_env": "args",
    "prepare_pippy": (
        "model, split_points='auto', no_split_module_classes=None, example_args=(), example_kwargs=None, "
        "num_chunks=None, gather_output=False"
    ),
    "prepare_sagemager_args_inputs": "sagemaker_config, args",
    "prepare_tpu": "args, current_env, pod=False",
    "save_fsdp_model": "fsdp_plugin, accelerator, model, output_dir, model_index=0, adapter_only=False, use_dcp=True",
    "save_fsdp_optimizer": "fsdp_plugin, accelerator, optimizer, model, output_dir, optimizer_index=0, use_dcp=True",
    "set_numa_affinity": "local_process_index, verbose=None",
    "torchao_required": "func",
    "write_basic_config": "mixed_precision='no', save_location=None",
    # names at the accelerate.hooks, .big_modeling, .utils.bnb, .utils.launch and .utils.modeling paths
    "env_var_path_add": 'env_var_name, path_to_add',
    "get_keys_to_not_convert": 'model',
    "get_parameter_device": 'parameter',
    "get_quantized_model_device_map": (
        'model, bnb_quantization_config, device_map=None, max_memory=None, no_split_module_classes=None'
    ),
    "prepare_extend_env_parallelism_config": 'args, current_env',
    "quantize_and_offload_8bit": (
        'model, param, param_name, new_dtype, offload_folder, offload_index, fp16_statistics'
    ),
    "replace_with_bnb_layers": 'model, bnb_quantization_config, modules_to_not_convert=None, current_key_name=None',
    "setup_fp8_env": 'args, current_env',
}


def accelerate_signature(name: str, method: bool = False) -> inspect.Signature:
    """The signature of ``ACCELERATE_SIGNATURES[name]`` (with ``self`` first for a method)."""
    arguments = ast.parse(f"def _({'self, ' if method else ''}{ACCELERATE_SIGNATURES[name]}): pass").body[0].args  # type: ignore[attr-defined]  # body[0] is the def just parsed
    kind = inspect.Parameter
    positional = arguments.posonlyargs + arguments.args
    defaults = [kind.empty] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    parameters = [kind(a.arg, kind.POSITIONAL_ONLY if a in arguments.posonlyargs else kind.POSITIONAL_OR_KEYWORD,
                       default=d if d is kind.empty else ast.literal_eval(d)) for a, d in zip(positional, defaults)]
    if arguments.vararg:
        parameters.append(kind(arguments.vararg.arg, kind.VAR_POSITIONAL))
    parameters += [kind(a.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else ast.literal_eval(d))
                   for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    if arguments.kwarg:
        parameters.append(kind(arguments.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _refuse(name: str) -> NoReturn:
    raise NotImplementedError(f"{name}: {NOT_DRIVEN[name]}.")


def refusing_function(name: str) -> Any:
    """A function named ``name`` that raises ``NotImplementedError`` with the reason trainkit cannot run it."""

    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(name)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not available in trainkit: {NOT_DRIVEN[name]}."
    refused.__signature__ = accelerate_signature(name)  # type: ignore[attr-defined]  # Accelerate's signature, for inspect
    return refused


def refusing_class(name: str) -> type:
    """A class named ``name`` whose construction raises ``NotImplementedError`` with the reason."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _refuse(name)

    __init__.__signature__ = accelerate_signature(name, method=True)  # type: ignore[attr-defined]  # Accelerate's signature, for inspect
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
