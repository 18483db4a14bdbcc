"""Small configuration objects that Accelerate scripts import and pass to ``Accelerator(...)``."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from trainkit.config.checkpointing import (
    ASYNC_SAVE,
    ASYNC_SAVE_WHEN_BUSY,
    AUTOMATIC_CHECKPOINT_NAMING,
    SAVE_ON_EACH_NODE,
    TOTAL_LIMIT,
)
from trainkit.config.options import parse_declared

from .enums import _ContainsByValue
from .enums import (  # noqa: F401 - re-exported: scripts import the enums from here too
    ListableEnum,
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


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How ``Accelerator.prepare`` shards dataloaders across processes.

    split_batches: each yielded batch is the *global* batch and is split across processes (batch size
        must be a multiple of the number of processes); otherwise each process gets whole batches.
    even_batches: pad the last global batch with samples from the start of the epoch so every process
        gets batches of the same size (``gather_for_metrics`` drops the padding again).
    use_seedable_sampler: True replaces a ``RandomSampler`` by a :class:`SeedableRandomSampler` (order from
        ``data_seed`` and the epoch alone). False (the default, as in Accelerate) keeps the user's sampler and
        its generator, copied from the main process at each pass: every process draws the order one process
        would, so training on N processes with the same global batch gives the one-process numbers.
        Either way the order is the same on every process and a checkpoint replays it.
    non_blocking: copy batches to the device with ``non_blocking=True``.
    data_seed: seed of the seedable sampler's order; default: torch's initial seed (so ``set_seed`` fixes it).
    use_stateful_dataloader: ``load_state`` also restores each prepared loader's position inside its
        epoch (exact and reshardable; see docs/checkpoints.md). False (Accelerate's default): ``load_state``
        restores the epoch only and the script calls ``skip_first_batches`` for the batches already seen.
    dispatch_batches: for an iterable dataset, True makes the main process read every global batch and
        send each process its slice (the others read nothing); None or False (trainkit's default, unlike
        Accelerate's) lets every process read only its own shards — see docs/streaming.md. For a map-style
        dataset every process reads its own part of the same batches (True: a one-line notice says so).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


class KwargsHandler:
    """Base of the ``kwargs_handlers`` objects: non-default fields become keyword arguments."""

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]  # subclasses are dataclasses

    def to_kwargs(self) -> dict[str, Any]:
        """Return the fields whose values differ from the defaults."""
        default = self.__class__().to_dict()
        return {name: value for name, value in self.to_dict().items() if value != default[name]}


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Keyword arguments passed on to ``torch.nn.parallel.DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    """Gradient communication hook registered on the DDP model (fp16/bf16 compression, PowerSGD)."""
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    """Compression (fp16/bf16) wrapped around a PowerSGD hook."""
    comm_state_option: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments of the PowerSGD hook's state (e.g. ``matrix_approximation_rank``)."""

    def to_dict(self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict[str, Any]:
        """The DDP constructor's keyword arguments (the hook fields are registered separately)."""
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Keyword arguments passed on to ``torch.amp.GradScaler`` under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Keyword arguments for ``torch.distributed.init_process_group`` (backend and timeout)."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclasses.dataclass
class ProjectConfiguration:
    """Where trackers and automatically named checkpoints go (Accelerate's ``project_config``); its checkpointing
    settings are declared once, with their help, in ``trainkit.config.checkpointing`` and parsed here, once."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = AUTOMATIC_CHECKPOINT_NAMING.field()
    total_limit: int | None = TOTAL_LIMIT.field()
    iteration: int = 0
    save_on_each_node: bool = SAVE_ON_EACH_NODE.field()
    # trainkit extensions: keyword-only, so no positional call written for Accelerate can reach them.
    async_save: bool = ASYNC_SAVE.field(kw_only=True)
    async_save_when_busy: str = ASYNC_SAVE_WHEN_BUSY.field(kw_only=True)

    def __post_init__(self) -> None:
        parse_declared(self, lambda name: "ProjectConfiguration")

    @classmethod
    def from_parsed(cls, **values: Any) -> ProjectConfiguration:
        """A configuration from values another surface already parsed by the same declarations
        (``TrainingArguments``' checks): nothing is parsed a second time (``__post_init__`` is not run)."""
        config = cls.__new__(cls)
        for field in dataclasses.fields(cls):
            setattr(config, field.name, values.pop(field.name, field.default))
        if values:
            raise TypeError(f"ProjectConfiguration.from_parsed: unknown fields {sorted(values)}.")
        return config

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set ``project_dir`` and default ``logging_dir`` to it."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Options of the mixed-precision autocast context (``Accelerator.autocast(autocast_handler=...)``)."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Options of ``Accelerator.profile()``, passed on to ``torch.profiler.profile``.

    activities: "cpu", "cuda", "xpu"... (default: the CPU, plus CUDA when the run uses it).
    schedule_option: keyword arguments of ``torch.profiler.schedule`` (wait, warmup, active, repeat, skip_first).
    output_trace_dir: write one Chrome trace per process there (``trace_rank_<i>.json``) when profiling ends.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Accumulation options (``Accelerator(gradient_accumulation_plugin=...)``).

    num_steps: micro-batches per optimizer step.
    adjust_scheduler: accepted; as in Accelerate, prepared schedulers advance on optimizer steps only and
        ``GradientState.adjust_scheduler`` reads False whatever is given (Accelerate's reading).
    sync_with_dataloader: close the accumulation window at the end of a dataloader (trainkit always does).
    sync_each_batch: synchronise gradients on every micro-batch (saves memory under DDP/FSDP, costs bandwidth).
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


class _AbsentFeature:
    """Base of the names of features trainkit does not drive: constructing one raises, saying why; each subclass
    carries Accelerate's parameters (``trainkit.utils.unsupported.ACCELERATE_SIGNATURES``) for introspection."""

    reason = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from trainkit.utils.unsupported import accelerate_signature

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            _AbsentFeature.__init__(self)

        __init__.__signature__ = accelerate_signature(cls.__name__, method=True)  # type: ignore[attr-defined]  # Accelerate's signature, for inspect
        cls.__init__ = __init__  # type: ignore[method-assign]  # the refusing constructor replaces the generated one

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from trainkit.utils.unsupported import NOT_DRIVEN

        name = type(self).__name__
        raise NotImplementedError(f"{name}: {NOT_DRIVEN.get(name, self.reason)}.")


class MegatronLMPlugin(_AbsentFeature):
    """Megatron-LM options. trainkit does not drive Megatron-LM."""

    reason = "trainkit does not drive Megatron-LM (tensor/pipeline parallelism); use FSDP2 (see docs/fsdp.md)."


class MegatronLMDummyScheduler(_AbsentFeature):
    """Megatron-LM's placeholder scheduler."""

    reason = MegatronLMPlugin.reason


class FP8RecipeKwargs(_AbsentFeature):
    """FP8 training recipe. trainkit has no fp8 path (mixed_precision is "no", "fp16" or "bf16")."""

    reason = "trainkit has no fp8 training (needs TransformerEngine/MS-AMP/torchao); use mixed_precision='bf16'."


class TERecipeKwargs(FP8RecipeKwargs):
    """TransformerEngine fp8 recipe (see :class:`FP8RecipeKwargs`)."""


class MSAMPRecipeKwargs(FP8RecipeKwargs):
    """MS-AMP fp8 recipe (see :class:`FP8RecipeKwargs`)."""


class AORecipeKwargs(FP8RecipeKwargs):
    """torchao fp8 recipe (see :class:`FP8RecipeKwargs`)."""


MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Any] = {}
"""Accelerate's registry of Megatron-LM model-config parsers; empty, as trainkit does not drive Megatron-LM."""

EnumWithContains = _ContainsByValue
"""Accelerate's name for the enum metaclass that makes ``"value" in SomeEnum`` work."""
BaseEnum = ListableEnum
"""Accelerate's name for the base of its string enums (``str(member)`` is the value, ``.list()`` the values)."""


def get_module_class_from_name(module: Any, name: str) -> type | None:
    """The class called ``name`` among ``module`` and its submodules (depth first), or None."""
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


# Accelerate keeps these in accelerate.utils.dataclasses; trainkit defines them where they live (loaded on use,
# so importing a dataclass from here never drags torch or the engine in).
_ELSEWHERE = {
    "CustomDtype": "trainkit.utils.model_tensors",
    "TensorInformation": "trainkit.utils.structures",
    "TorchDynamoPlugin": "trainkit.config.dynamo",
    "DeepSpeedPlugin": "trainkit.config.deepspeed",
    "TorchContextParallelConfig": "trainkit.config.parallelism",
    "DeepSpeedSequenceParallelConfig": "trainkit.config.parallelism",
    "FullyShardedDataParallelPlugin": "trainkit.engine.strategies.fsdp.plugin",
}


def __getattr__(name: str) -> Any:
    """Names defined elsewhere in trainkit, and Accelerate's dataclasses for features trainkit does not drive
    (placeholders that raise when constructed)."""
    import importlib

    from trainkit.utils.unsupported import NOT_DRIVEN, placeholder

    if name in _ELSEWHERE:
        value = globals()[name] = getattr(importlib.import_module(_ELSEWHERE[name]), name)
        return value
    if name in NOT_DRIVEN:
        value = globals()[name] = placeholder(name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
