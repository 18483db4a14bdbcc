"""Availability checks for optional packages and devices, cheap enough to call anywhere."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import lru_cache

from trainkit.utils.versions import is_torch_version  # accelerate.utils.imports names it too


@lru_cache(maxsize=None)
def is_package_available(name: str) -> bool:
    """True when ``name`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(name) is not None


def is_tensorboard_available() -> bool:
    """True when TensorBoard's writer can be used."""
    return is_package_available("tensorboard") or is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    """True when Weights & Biases is installed."""
    return is_package_available("wandb")


def is_xpu_available(check_device: bool = False) -> bool:
    """True when an Intel XPU device is usable through torch (trainkit does not drive XPUs)."""
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_npu_available(check_device: bool = False) -> bool:
    """True when an Ascend NPU is usable (needs the torch_npu extension; trainkit does not drive NPUs)."""
    if not is_package_available("torch_npu"):
        return False
    import torch

    return hasattr(torch, "npu") and torch.npu.is_available()


def is_cuda_available() -> bool:
    """True when a CUDA device is usable."""
    import torch

    return torch.cuda.is_available()


# Accelerate's availability checks for optional packages: "is it installed", checked without importing.
def _installed(*names: str) -> Callable[[], bool]:
    def check() -> bool:
        return any(is_package_available(name) for name in names)

    check.__doc__ = f"True when {' or '.join(names)} is installed (trainkit may still not drive it; see docs)."
    return check


is_mlflow_available = _installed("mlflow")
is_comet_ml_available = _installed("comet_ml")
is_aim_available = _installed("aim")
is_clearml_available = _installed("clearml")
is_dvclive_available = _installed("dvclive")
is_swanlab_available = _installed("swanlab")
is_trackio_available = _installed("trackio")
is_datasets_available = _installed("datasets")
is_transformers_available = _installed("transformers")
is_peft_available = _installed("peft")
is_timm_available = _installed("timm")
is_torchvision_available = _installed("torchvision")
is_schedulefree_available = _installed("schedulefree")
is_rich_available = _installed("rich")
is_pandas_available = _installed("pandas")
is_matplotlib_available = _installed("matplotlib")
is_boto3_available = _installed("boto3")
is_pytest_available = _installed("pytest")
is_deepspeed_available = _installed("deepspeed")
is_megatron_lm_available = _installed("megatron")


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """True when torch_xla is installed (trainkit does not drive TPUs/XLA devices)."""
    return is_package_available("torch_xla")


is_transformer_engine_available = _installed("transformer_engine")
is_msamp_available = _installed("msamp")
is_torchao_available = _installed("torchao")


def is_bnb_available(min_version: str | None = None) -> bool:
    """True when bitsandbytes is installed (at least ``min_version`` when given)."""
    if not is_package_available("bitsandbytes"):
        return False
    if min_version is None:
        return True
    import importlib.metadata

    from packaging.version import Version

    return Version(importlib.metadata.version("bitsandbytes")) >= Version(min_version)


def is_4bit_bnb_available() -> bool:
    """True when bitsandbytes can quantize to 4 bits (0.39 or newer)."""
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    """True when bitsandbytes can quantize to 8 bits (0.37.2 or newer)."""
    return is_bnb_available("0.37.2")


is_torchdata_available = _installed("torchdata")
is_torchdata_stateful_dataloader_available = _installed("torchdata")
is_triton_available = _installed("triton")
is_pynvml_available = _installed("pynvml")


def is_mps_available(min_version: str = "1.12") -> bool:
    """True when Apple's MPS device is usable."""
    import torch

    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def is_mlu_available(check_device: bool = False) -> bool:
    """False: trainkit drives no Cambricon MLU."""
    return False


is_musa_available = is_sdaa_available = is_neuron_available = is_mlu_available


def is_hpu_available(init_hccl: bool = False) -> bool:
    """False: trainkit drives no Habana Gaudi HPU."""
    return False


def is_habana_gaudi1() -> bool:
    """False: trainkit drives no Habana Gaudi HPU."""
    return False


def is_transformer_engine_mxfp8_available() -> bool:
    """False: trainkit has no fp8 training path."""
    return False


def is_xccl_available() -> bool:
    """False: trainkit uses gloo (CPU) and nccl (CUDA) process groups, not Intel's XCCL."""
    return False


def is_bitsandbytes_multi_backend_available() -> bool:
    """False: trainkit does not quantize with bitsandbytes (on any backend)."""
    return False


def is_pippy_available() -> bool:
    """False: trainkit does not drive pipeline-parallel inference."""
    return False


def is_rocm_available() -> bool:
    """True when torch was built for AMD ROCm (its GPUs appear as CUDA devices)."""
    import torch

    return getattr(torch.version, "hip", None) is not None


def is_weights_only_available() -> bool:
    """True: ``torch.load(weights_only=True)`` exists in every torch trainkit supports (and trainkit uses it)."""
    return True


is_amdsmi_available = _installed("amdsmi")
is_import_timer_available = _installed("import_timer")
is_lomo_available = _installed("lomo_optim")
is_sagemaker_available = _installed("sagemaker")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bfloat16 autocast works here (CPU always; CUDA when the GPU supports it)."""
    import torch

    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True


def is_fp16_available() -> bool:
    """True: float16 autocast with a GradScaler works on CPU and CUDA."""
    return True


def is_fp8_available() -> bool:
    """False: trainkit has no fp8 training path."""
    return False
