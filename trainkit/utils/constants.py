"""``accelerate.utils.constants``: file names, option lists and version floors, with Accelerate's values.

Scripts and libraries build checkpoint paths from these (``os.path.join(out, SAFE_WEIGHTS_NAME)``), so the
values are Accelerate's exactly. Plain data only: importing this module loads nothing heavy.
"""

from __future__ import annotations

import operator

from trainkit.config.fsdp import AUTO_WRAP_POLICIES, BACKWARD_PREFETCH, SHARDING_STRATEGIES

# Checkpoint file names (save_state / save_model write these).
SCALER_NAME = "scaler.pt"
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
FSDP_MODEL_NAME = "pytorch_model_fsdp"

# SageMaker (Accelerate's launcher settings; trainkit does not launch on SageMaker).
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

# FSDP option names, as `accelerate config` offers them (the choices config/fsdp.py declares).
FSDP_SHARDING_STRATEGY = list(SHARDING_STRATEGIES)
FSDP_AUTO_WRAP_POLICY = list(AUTO_WRAP_POLICIES)
FSDP_BACKWARD_PREFETCH = list(BACKWARD_PREFETCH)
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]

# Version floors Accelerate checks features against.
FSDP_PYTORCH_VERSION = "2.1.0.a0+32f93b1"
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

# Comparison operators by their spelling (is_torch_version("<", "2.6")).
STR_OPERATION_TO_FUNC = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                         "<=": operator.le, "<": operator.lt}

# torch.distributed.run's own options (a launcher passes these through unchanged).
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
    "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]

# DistributedType values (strings) on which collectives run over a process group.
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = CUDA_DISTRIBUTED_TYPES + [
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON"]


def __getattr__(name: str) -> object:
    # A tuple of torch layer classes: loaded on first use so that this module stays plain data.
    if name == "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING":
        from trainkit.engine.inference.dispatch import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

        return SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
