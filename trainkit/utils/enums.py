"""Accelerate's enumerations, with every member, so scripts that compare against any of them run.

A member naming hardware or a backend trainkit does not drive (XLA, NPU, Megatron-LM...) exists so that
``accelerator.distributed_type == DistributedType.XLA`` is simply False; it never becomes active.
"""

from __future__ import annotations

import enum


class _ContainsByValue(enum.EnumMeta):
    """``"fp16" in PrecisionType`` is True: membership tests accept raw values as well as members."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class ListableEnum(enum.Enum, metaclass=_ContainsByValue):
    """An enum whose ``str()`` is its value and whose ``list()`` gives every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """Every value, in declaration order."""
        return [str(member) for member in cls]


class DistributedType(str, enum.Enum):
    """How the processes of a run cooperate. trainkit activates NO, MULTI_CPU, MULTI_GPU, FSDP and DEEPSPEED
    (a DeepSpeed config run on trainkit's DDP/FSDP2 engine, see docs/deepspeed.md)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


ACTIVE_DISTRIBUTED_TYPES = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.FSDP,
                            DistributedType.DEEPSPEED)
"""The members trainkit can make active; the others only exist for comparisons."""


class SageMakerDistributedType(str, enum.Enum):
    """SageMaker's parallelism kinds (trainkit does not launch on SageMaker)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(str, enum.Enum):
    """Where the job runs; trainkit launches on LOCAL_MACHINE (one or many machines)."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class FP8BackendType(str, enum.Enum):
    """FP8 training backends (trainkit has no fp8 path: ``mixed_precision="fp8"`` is an error)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class DynamoBackend(str, ListableEnum):
    """``torch.compile`` backends, by Accelerate's names."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class LoggerType(ListableEnum):
    """Tracker names for ``Accelerator(log_with=...)``; trainkit drives tensorboard, wandb and mlflow."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class PrecisionType(str, ListableEnum):
    """Values of ``mixed_precision`` (fp8 is listed but not available in trainkit)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(ListableEnum):
    """Random generators a checkpoint may hold (trainkit saves python, numpy, torch and CUDA states)."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DDPCommunicationHookType(ListableEnum):
    """DDP gradient communication hooks (``DistributedDataParallelKwargs(comm_hook=...)``)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"
