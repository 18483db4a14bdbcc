"""The transformers 5.x TrainingArguments fields beyond the core ones: their checks, and what scripts read back.

``check_transformers_fields`` validates and normalises them at construction, so a field that cannot act
here (it needs a package, hardware or an integration trainkit does not have) fails at once, naming what it
needs. ``ProcessAttributes`` gives TrainingArguments the process facts scripts read from it (``should_log``,
``process_index``, ``device``, ``parallel_mode``, ...), answered by the engine's process state.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import numbers
import os
import types
import typing
from datetime import timedelta
from typing import Any

from trainkit.config.errors import ConfigError, check_choice
from trainkit.config.checkpointing import training_arguments_fields as checkpointing_fields
from trainkit.trainer.training_arguments.accelerator_config import ACCELERATOR_CONFIG_KEYS, ACCUMULATION_KEYS, AcceleratorConfig
from trainkit.trainer.training_arguments.older_fields import apply_older_fields

logger = logging.getLogger(__name__)

WHERE = "TrainingArguments"
SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")
DDP_BACKENDS = ("nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl")
DEFAULT_DDP_TIMEOUT_S = 1800  # transformers' default for ddp_timeout; left there, it counts as not set
WORKER_START_METHODS = ("fork", "spawn", "forkserver")
DEBUG_OPTIONS = ("underflow_overflow", "tpu_metrics_debug")


def check_transformers_fields(args: Any) -> None:
    """Validate and normalise the fields beyond the core ones (called first by ``TrainingArguments.__post_init__``);
    before them, the type of every number and boolean field and the output folder."""
    check_field_types(args)
    check_output_dir(args.output_dir)
    value = args.lr_scheduler_kwargs
    if not (value is None or isinstance(value, dict) or (isinstance(value, str) and value.lstrip().startswith("{"))):
        raise ConfigError(f"lr_scheduler_kwargs={value!r} in {WHERE} must be a dict or a JSON object string "
                          "(e.g. '{\"num_cycles\": 2}').")
    _merge_checkpointing_alias(args)
    apply_older_fields(args, warn_once)  # transformers 5.1's warmup_ratio, group_by_length, logging_dir
    _check_unavailable_features(args)
    _check_distributed(args)
    _check_data_loading(args)
    _check_evaluation(args)
    for name, (_, option) in checkpointing_fields().items():  # parsed here, once: the Trainer hands them over
        setattr(args, name, option.read(getattr(args, name), name, WHERE))
    _check_checkpoint_dir(args)
    _check_precision_device(args)
    _apply_tf32(args.tf32, args.use_cpu)
    args.accelerator_config = _load_accelerator_config(args.accelerator_config)
    _apply_accumulation_kwargs(args)
    args.debug = _parse_debug(args.debug)
    if args.label_smoothing_factor < 0 or args.label_smoothing_factor >= 1:
        raise ConfigError(f"label_smoothing_factor={args.label_smoothing_factor!r} in {WHERE} must be in [0, 1).")
    if args.neftune_noise_alpha is not None and args.neftune_noise_alpha <= 0:
        raise ConfigError(f"neftune_noise_alpha={args.neftune_noise_alpha!r} in {WHERE} must be > 0 (or None for off).")
    if args.torch_empty_cache_steps is not None:
        steps = args.torch_empty_cache_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:  # a count of steps: 1.0 is refused too
            raise ConfigError(f"torch_empty_cache_steps={steps!r} in {WHERE} must be an integer >= 1 or None.")
        if args.use_cpu or not _has_accelerator():
            warn_once("torch_empty_cache_steps: training runs on CPU, which has no device cache to empty; nothing to do.")
    if args.project != "huggingface":
        warn_once(f"project={args.project!r} is read by the Trackio tracker only, which trainkit does not drive; "
                  "trackers name the run after run_name.")
    for line in fields_without_effect(args):
        warn_once(line)


HUB_FIELDS_DEFAULTS = {"hub_model_id": None, "hub_strategy": "every_save", "hub_token": None,
                       "hub_private_repo": None, "hub_always_push": False, "hub_revision": None}
_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it (arguments are often built twice)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def fields_without_effect(args: Any) -> list[str]:
    """One line per field set to a value that changes nothing in this run, naming the field and why."""
    lines = []
    if args.hub_always_push and args.push_to_hub:
        lines.append(f"hub_always_push=True in {WHERE} has no effect: trainkit uploads synchronously at each save, "
                     "so no push is ever skipped (every push already happens).")
    hub_set = [name for name, default in HUB_FIELDS_DEFAULTS.items() if getattr(args, name) != default]
    if hub_set and not args.push_to_hub:
        one = len(hub_set) == 1
        lines.append(f"{', '.join(hub_set)} in {WHERE} {'has' if one else 'have'} no effect: "
                     f"{'it is' if one else 'they are'} read only with push_to_hub=True.")
    if args.save_strategy == "no":
        checkpoint_set = [name for name, default in (("save_total_limit", None), ("save_only_model", False))
                          if getattr(args, name) != default]
        if checkpoint_set:
            lines.append(f"{', '.join(checkpoint_set)} in {WHERE} {'has' if len(checkpoint_set) == 1 else 'have'} "
                         "no effect: save_strategy='no' writes no checkpoints.")
    if args.async_save_when_busy != "wait" and not (args.async_save and args.save_strategy != "no"):
        lines.append(f"async_save_when_busy={args.async_save_when_busy!r} in {WHERE} has no effect: it is read only "
                     "with async_save=True and save_strategy other than 'no'.")
    if args.activation_checkpointing_kwargs and not args.activation_checkpointing:
        lines.append(f"activation_checkpointing_kwargs (gradient_checkpointing_kwargs) in {WHERE} has no effect: "
                     "activation_checkpointing is off.")
    if args.length_column_name != "length" and args.train_sampling_strategy != "group_by_length":
        lines.append(f"length_column_name={args.length_column_name!r} in {WHERE} has no effect: it is read only "
                     "with train_sampling_strategy='group_by_length'.")
    launcher_rank = os.environ.get("LOCAL_RANK")
    if args.local_rank != -1 and str(args.local_rank) != launcher_rank:
        lines.append(f"local_rank={args.local_rank} in {WHERE} has no effect: the rank comes from the launcher's "
                     f"environment (LOCAL_RANK={launcher_rank if launcher_rank is not None else 'unset'}).")
    return lines


_SCALAR_TYPES = (bool, int, float, type(None))


def _scalar_annotation(annotation: Any) -> tuple[type, ...] | None:
    """The types a number/boolean field allows (``float``, ``int | None``, ...); None for any other field."""
    if isinstance(annotation, type):
        members: tuple[Any, ...] = (annotation,)
    elif isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = typing.get_args(annotation)
    else:
        return None
    if not all(member in _SCALAR_TYPES for member in members) or members == (type(None),):
        return None
    return members


def _fits(value: Any, allowed: tuple[type, ...]) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool too
        return bool in allowed
    if isinstance(value, numbers.Integral):
        return int in allowed or float in allowed
    if isinstance(value, numbers.Real):
        return float in allowed or int in allowed  # a float for an int field: the field's own check says if it is whole
    return False


def check_field_types(args: Any) -> None:
    """Every number and boolean field holds a number / a boolean, or fails now naming the field.

    transformers' TrainingArguments keeps a string such as ``num_train_epochs="3"`` or ``learning_rate="1e-3"``
    as it is (only HfArgumentParser converts command-line strings), and its Trainer then stops with a bare
    TypeError; a string in a boolean field is worse, as ``fp16="False"`` is true. Nothing is guessed here:
    the message shows the value to pass instead.
    """
    annotations = _declared_types(args.__class__)
    for field_ in dataclasses.fields(args):
        allowed = _scalar_annotation(annotations.get(field_.name))
        value = getattr(args, field_.name)
        if allowed is None or _fits(value, allowed):
            continue
        wanted = " or ".join({bool: "True/False", int: "an integer", float: "a number", type(None): "None"}[t]
                             for t in allowed)
        hint = ""
        if isinstance(value, str):
            parsed = parse_number_or_bool(value)
            if parsed is not None and _fits(parsed, allowed):
                hint = f" Pass {field_.name}={parsed!r}: strings are converted only on the command line (HfArgumentParser)."
                if isinstance(parsed, float) and "e" in value.lower() and "." not in value:
                    hint += f" (A YAML 1.1 loader reads {value} as a string; write it with a dot, e.g. 1.0e-3.)"
        raise ConfigError(f"{field_.name}={value!r} in {WHERE} must be {wanted}, not {type(value).__name__}.{hint}")


@functools.lru_cache(maxsize=None)
def _declared_types(cls: type) -> dict[str, Any]:
    """The fields' annotations as the class declares them (HfArgumentParser rewrites ``Field.type`` in place:
    ``float | None`` becomes ``float``). A subclass whose annotations cannot be resolved is not checked."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


def parse_number_or_bool(text: str) -> Any:
    """``text`` as a bool ("true"/"false", any case), an int or a float; None when it is none of them."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return None


def _check_checkpoint_dir(args: Any) -> None:
    """``checkpoint_dir``: a folder or a URL of a storage trainkit can write (an unknown scheme fails now, by name)."""
    if args.checkpoint_dir is None:
        return
    from trainkit.engine import check_location

    args.checkpoint_dir = str(args.checkpoint_dir)
    check_location(args.checkpoint_dir, where=f"checkpoint_dir in {WHERE}")
    if "://" in args.checkpoint_dir and args.push_to_hub and args.hub_strategy != "end":
        raise ConfigError(f"checkpoint_dir={args.checkpoint_dir!r} with push_to_hub and hub_strategy="
                          f"{args.hub_strategy!r} in {WHERE}: checkpoints are uploaded to the Hub from a local folder; "
                          "use hub_strategy='end' or a local checkpoint_dir.")


def check_output_dir(output_dir: str) -> None:
    """``output_dir`` (or the nearest part of it that exists) must be a folder: a file there fails now."""
    path = os.path.abspath(output_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        where = "is" if path == os.path.abspath(output_dir) else f"is inside {path!r}, which is"
        raise ConfigError(f"output_dir={output_dir!r} in {WHERE} {where} an existing file, not a folder: checkpoints, "
                          "logs and the model are written into a folder there. Choose another output_dir.")


def _merge_checkpointing_alias(args: Any) -> None:
    """activation_checkpointing (transformers 5) and gradient_checkpointing (its old name) are one setting."""
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, _json_dict(name, value))
    pairs = (("activation_checkpointing", "gradient_checkpointing"),
             ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"))
    for new, old in pairs:
        new_value, old_value = getattr(args, new), getattr(args, old)
        if new_value is not None and old_value is not None and new_value != old_value:
            raise ConfigError(f"{WHERE}: {new}={new_value!r} and {old}={old_value!r} name one setting with two "
                              f"values; set only {new} (transformers 5's name).")
        merged = new_value if new_value is not None else old_value
        setattr(args, new, merged)
        setattr(args, old, merged)
    args.activation_checkpointing = args.gradient_checkpointing = bool(args.activation_checkpointing)


def _check_unavailable_features(args: Any) -> None:
    """Fields whose feature needs something trainkit or this machine lacks: fail now, naming it."""
    if args.deepspeed is not None:  # a DeepSpeed config is read and checked now, as transformers does
        from .deepspeed import deepspeed_for_trainer

        translated = deepspeed_for_trainer(args)
        if (translated.settings.fsdp_config or {}).get("fsdp_cpu_ram_efficient_loading"):  # zero3_init_flag
            from trainkit.engine import load_on_rank0_only

            load_on_rank0_only()  # arguments come before from_pretrained in a Trainer script
    if args.parallelism_config is not None:  # its type and degrees now; its product against the world at training
        from trainkit.config.engine import parse_parallelism

        parallelism = parse_parallelism(args.parallelism_config, f"parallelism_config in {WHERE}")
        if parallelism is not None and (parallelism.cp_size != 1 or parallelism.sp_size != 1) and \
                args.label_smoothing_factor:
            raise ConfigError(f"label_smoothing_factor={args.label_smoothing_factor} in {WHERE} with cp_size/sp_size "
                              "> 1: the smoothed loss is computed outside the model on whole-sequence labels, but each "
                              "rank's logits cover its part of the sequence; use label_smoothing_factor=0.")
    optim = str(getattr(args.optim, "value", args.optim))
    if args.optim_target_modules is not None and not optim.startswith(("galore", "apollo")):
        raise ConfigError(f"optim_target_modules in {WHERE} is read only by the GaLore/APOLLO optimizers "
                          f"(optim='galore_*' or 'apollo_*'); optim={optim!r} ignores it.")
    for name in ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"):
        value = getattr(args, name)
        if value is not None and value is not False:
            raise ConfigError(f"{name}={value!r} in {WHERE} needs the Trackio tracker (report_to='trackio'), which "
                              "trainkit does not drive; use report_to='tensorboard' or 'wandb'.")
    if args.use_liger_kernel and importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(f"use_liger_kernel=True in {WHERE} needs the liger-kernel package (and a GPU); it is not installed.")
    if args.liger_kernel_config is not None and not args.use_liger_kernel:
        raise ConfigError(f"liger_kernel_config in {WHERE} only acts with use_liger_kernel=True.")
    if not args.skip_memory_metrics and importlib.util.find_spec("psutil") is None:
        raise ConfigError(f"skip_memory_metrics=False in {WHERE} needs the psutil package to measure memory; it is not installed.")


def _check_distributed(args: Any) -> None:
    if args.ddp_backend is not None:
        args.ddp_backend = check_choice("ddp_backend", str(args.ddp_backend).lower(), DDP_BACKENDS, where=WHERE)
        if args.ddp_backend == "nccl" and (args.use_cpu or not _has_cuda()):
            raise ConfigError(f"ddp_backend='nccl' in {WHERE} needs NVIDIA GPUs, and this run is on CPU: use 'gloo'.")
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_backend_available(args.ddp_backend):
            raise ConfigError(f"ddp_backend={args.ddp_backend!r} in {WHERE}: this torch build has no {args.ddp_backend} "
                              "backend (it needs its own hardware and build); use 'gloo' (CPU) or 'nccl' (NVIDIA).")
    if not isinstance(args.ddp_timeout, int) or isinstance(args.ddp_timeout, bool) or args.ddp_timeout < 1:
        raise ConfigError(f"ddp_timeout={args.ddp_timeout!r} in {WHERE} must be a whole number of seconds >= 1.")
    if args.ddp_bucket_cap_mb is not None and args.ddp_bucket_cap_mb <= 0:
        raise ConfigError(f"ddp_bucket_cap_mb={args.ddp_bucket_cap_mb!r} in {WHERE} must be > 0 or None.")
    if args.fsdp and any(getattr(args, n) is not None for n in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb",
                                                                 "ddp_broadcast_buffers", "ddp_static_graph")):
        raise ConfigError(f"{WHERE}: ddp_find_unused_parameters/ddp_bucket_cap_mb/ddp_broadcast_buffers/ddp_static_graph "
                          "configure DistributedDataParallel, but fsdp is on (FSDP does not take them).")


def _check_data_loading(args: Any) -> None:
    args.train_sampling_strategy = check_choice("train_sampling_strategy", args.train_sampling_strategy,
                                                SAMPLING_STRATEGIES, where=WHERE)
    if args.train_sampling_strategy == "batch_rebalance":
        raise ConfigError(f"train_sampling_strategy='batch_rebalance' in {WHERE} deals batches to ranks inside the "
                          "sampler, but trainkit's engine shards every sampler across ranks itself; use "
                          "'group_by_length' for length-grouped batches.")
    workers = args.dataloader_num_workers
    if args.dataloader_multiprocessing_context is not None:
        check_choice("dataloader_multiprocessing_context", args.dataloader_multiprocessing_context,
                     WORKER_START_METHODS, where=WHERE)
        if not workers:
            raise ConfigError(f"dataloader_multiprocessing_context in {WHERE} needs dataloader_num_workers > 0.")
    if not args.dataloader_in_order and not workers:
        raise ConfigError(f"dataloader_in_order=False in {WHERE} needs dataloader_num_workers > 0 (it reorders "
                          "worker batches).")


def _check_evaluation(args: Any) -> None:
    if args.bf16_full_eval and args.fp16_full_eval:
        raise ConfigError(f"{WHERE}: bf16_full_eval=True and fp16_full_eval=True contradict each other; choose one.")
    if args.batch_eval_metrics and not args.eval_do_concat_batches:
        raise ConfigError(f"{WHERE}: batch_eval_metrics=True computes metrics batch by batch, so nothing is "
                          "concatenated; leave eval_do_concat_batches at True.")


def _check_precision_device(args: Any) -> None:
    """fp16/bf16 against the device, by the engine's own table (fp16 and bf16 both run on CPU)."""
    if args.fp16 and args.bf16:
        return  # the contradiction is named by TrainingArguments itself
    from trainkit.engine import check_precision_device

    mode = "fp16" if args.fp16 else "bf16" if args.bf16 else "no"
    if args.use_cpu:
        check_precision_device(mode, "cpu", where=WHERE)


def _apply_tf32(tf32: bool | None, use_cpu: bool) -> None:
    """tf32=True needs an Ampere+ GPU; False turns TF32 off (meaningful wherever CUDA exists, harmless elsewhere)."""
    if tf32 is None:
        return
    import torch

    if tf32:
        if use_cpu or not _has_cuda() or torch.cuda.get_device_capability()[0] < 8:
            raise ConfigError(f"tf32=True in {WHERE} needs an Ampere or newer NVIDIA GPU (compute capability >= 8.0); "
                              "this run has none. Leave tf32 unset.")
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)


def _load_accelerator_config(value: Any) -> AcceleratorConfig:
    """accelerator_config (None, dict, an AcceleratorConfig of trainkit or transformers, JSON string or JSON file) ->
    trainkit's ``AcceleratorConfig`` (transformers' fields), checked: scripts that set
    ``args.accelerator_config.dispatch_batches = False`` work, and the Trainer reads it when it is created."""
    if value is None:
        value = {}
    if isinstance(value, type):  # the class itself, e.g. a dataclass field whose default is AcceleratorConfig
        # "Tried passing in a callable to `accelerator_config`" is transformers' wording, which scripts match
        raise NotImplementedError(
            f"accelerator_config in {WHERE}: Tried passing in a callable to `accelerator_config` (the class "
            f"{value.__name__}); pass an instance such as {value.__name__}(...), a dict or a JSON file.")
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            value = _json_dict("accelerator_config", value)
        elif os.path.isfile(value):
            with open(value, encoding="utf-8") as handle:
                value = _json_dict("accelerator_config", handle.read())
        else:
            raise ConfigError(f"accelerator_config={value!r} in {WHERE} is neither a JSON object nor an existing file.")
    config = dict(value)
    for key in config:
        check_choice("accelerator_config key", key, ACCELERATOR_CONFIG_KEYS, where=WHERE)
    if config.get("use_configured_state"):
        from trainkit.engine import process_state_exists

        if not process_state_exists():
            raise ConfigError(f"accelerator_config['use_configured_state']=True in {WHERE} reuses the process state "
                              "set up beforehand, and there is none yet: create the Accelerator (or PartialState) "
                              "first, or leave use_configured_state False.")
    if config.get("gradient_accumulation_kwargs") is not None:
        kwargs = dict(config["gradient_accumulation_kwargs"])
        for key in kwargs:
            check_choice("accelerator_config['gradient_accumulation_kwargs'] key", key, ACCUMULATION_KEYS, where=WHERE)
        config["gradient_accumulation_kwargs"] = kwargs
    return AcceleratorConfig(**config)


def _apply_accumulation_kwargs(args: Any) -> None:
    """accelerator_config["gradient_accumulation_kwargs"] as transformers' Trainer reads it: ``num_steps`` is
    another spelling of gradient_accumulation_steps (two different values are refused), ``sync_each_batch``
    synchronises gradients on every micro-batch (the Trainer passes it to the engine), and
    ``adjust_scheduler``/``sync_with_dataloader`` only concern an Accelerator's own accumulation, which the
    Trainer does not use (it opens each window itself): a notice says so."""
    kwargs = args.accelerator_config.gradient_accumulation_kwargs or {}
    if "num_steps" in kwargs:
        steps = kwargs["num_steps"]
        if args.gradient_accumulation_steps not in (1, steps):
            raise ConfigError(
                f"accelerator_config['gradient_accumulation_kwargs']['num_steps']={steps!r} and "
                f"gradient_accumulation_steps={args.gradient_accumulation_steps!r} in {WHERE} name one setting with "
                "two values; keep one of them.")
        args.gradient_accumulation_steps = steps
    for key in ("adjust_scheduler", "sync_with_dataloader"):
        if key in kwargs:
            warn_once(f"accelerator_config['gradient_accumulation_kwargs'][{key!r}] changes nothing in the Trainer: it "
                      "concerns an Accelerator's own accumulation, and the Trainer opens each window itself.")


def _parse_debug(value: Any) -> list[str]:
    items = value.split() if isinstance(value, str) else [getattr(v, "value", v) for v in (value or [])]
    items = [check_choice("debug", item, DEBUG_OPTIONS, where=WHERE) for item in items]
    if "tpu_metrics_debug" in items:
        raise ConfigError(f"debug='tpu_metrics_debug' in {WHERE} needs a TPU (torch_xla), which trainkit does not drive.")
    return items


def _json_dict(name: str, text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{name!r} in {WHERE} looks like JSON but does not parse: {error}.") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{name!r} in {WHERE} must be a JSON object, got {type(parsed).__name__}.")
    return parsed


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_accelerator() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator and accelerator.is_available()) or torch.cuda.is_available()


class ProcessAttributes:
    """What scripts read from TrainingArguments about this process, answered by the engine's process state.

    Reading any of these creates the process state (and, under a multi-process launch, the process group with
    ``ddp_backend`` and ``ddp_timeout``), as transformers does when its arguments set up the devices.
    """

    # The TrainingArguments fields and methods these read (the dataclass that mixes this in defines them).
    use_cpu: bool
    ddp_backend: str | None
    ddp_timeout: int
    log_on_each_node: bool
    save_on_each_node: bool
    log_level: str
    log_level_replica: str
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    if typing.TYPE_CHECKING:
        def warmup_steps_for(self, num_training_steps: int) -> int: ...
        def to_dict(self) -> dict[str, Any]: ...

    def _process_state(self) -> Any:
        from trainkit.config import load_launch_config_from_env
        from trainkit.engine import process_state

        launch = load_launch_config_from_env()
        cpu = True if self.use_cpu or (launch is not None and launch.use_cpu) else None  # None: not asked for
        return process_state(cpu=cpu, backend=self.ddp_backend, timeout=self.ddp_timeout_if_set)

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """``ddp_timeout`` as a timedelta."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def ddp_timeout_if_set(self) -> timedelta | None:
        """``ddp_timeout`` when changed from transformers' default (1800 s); None lets the launcher's
        ``collective_timeout`` or the engine's default decide, as for any setting left unset."""
        return None if self.ddp_timeout == DEFAULT_DDP_TIMEOUT_S else self.ddp_timeout_delta

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self._process_state().rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its machine."""
        return self._process_state().local_rank

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return self._process_state().world_size

    @property
    def device(self) -> Any:
        """This process's torch.device."""
        return self._process_state().device

    @property
    def n_gpu(self) -> int:
        """GPUs this process uses: 1 on a GPU (one per process; trainkit never uses DataParallel), else 0."""
        return 1 if self.device.type == "cuda" else 0

    @property
    def parallel_mode(self) -> Any:
        """transformers' ParallelMode: DISTRIBUTED with several processes, else NOT_PARALLEL."""
        from transformers.training_args import ParallelMode

        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the first of each machine (log_on_each_node) or only the global first."""
        return self.local_process_index == 0 if self.log_on_each_node else self.process_index == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: the first of each machine (save_on_each_node) or the global first."""
        return self.local_process_index == 0 if self.save_on_each_node else self.process_index == 0

    def get_process_log_level(self) -> int:
        """The logging level for this process: log_level where it logs, log_level_replica elsewhere ('passive'
        keeps transformers' current verbosity)."""
        from transformers.utils import logging as hf_logging

        name = self.log_level if self.should_log else self.log_level_replica
        return hf_logging.get_verbosity() if name == "passive" else getattr(logging, name.upper())

    @property
    def train_batch_size(self) -> int:
        """Training batch size per process (trainkit never uses DataParallel)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Evaluation batch size per process."""
        return self.per_device_eval_batch_size

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warm-up steps for ``num_training_steps`` (a warmup_steps below 1 is a ratio), as transformers."""
        return self.warmup_steps_for(num_training_steps)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """The arguments with values TensorBoard's hparams accept (others as strings)."""
        plain = (bool, int, float, str)
        return {k: v if isinstance(v, plain) else str(v) for k, v in self.to_dict().items()}
