"""DeepSpeed configs as trainkit settings: the one mapping from ZeRO's keys to FSDP2, DDP and the engine.

trainkit never imports DeepSpeed: a DeepSpeed config (a JSON file full of ``"auto"``, a dict, or the
``deepspeed_config:`` block of an Accelerate YAML) is translated here, once, into what trainkit's own
engine does with the same meaning:

==================================================  ==============================================
DeepSpeed                                           trainkit
==================================================  ==============================================
``zero_optimization.stage`` 0                       DDP
stage 1 (optimizer state partitioned)               DDP + optimizer state sharded across ranks
stage 2 (+ gradients)                               FSDP2 SHARD_GRAD_OP
stage 3 (+ parameters)                              FSDP2 FULL_SHARD
``offload_param`` + ``offload_optimizer`` to cpu    FSDP2 CPU offload (parameters, grads, optimizer)
``zero3_init_flag``                                 cpu_ram_efficient_loading (meta init, rank 0 loads)
``stage3_gather_16bit_weights_on_model_save``       FULL_STATE_DICT saves (else SHARDED_STATE_DICT)
``bf16`` / ``fp16`` blocks                          mixed_precision (fp16: GradScaler settings)
``gradient_accumulation_steps``, ``gradient_clipping``, batch sizes      the engine's own
``optimizer`` / ``scheduler`` blocks                the torch optimizer / schedule they name
==================================================  ==============================================

What has no FSDP2 meaning is refused by name, with the reason (:data:`REFUSED`); keys that only tune
DeepSpeed's internals are accepted and reported once as having no effect (:data:`NO_EFFECT`).
``"auto"`` values are filled from :class:`AutoValues` (the Accelerator's or TrainingArguments' settings),
as Accelerate and transformers fill them. Plain data: no torch here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError, check_choice, unknown_key_error
from .options import Option, boolean, check_keys, integer

OPTIMIZERS = ("Adam", "AdamW", "SGD")
SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
STAGE_MEANING = {0: "DDP", 1: "DDP + optimizer state sharded (ZeroRedundancyOptimizer)",
                 2: "FSDP2 SHARD_GRAD_OP", 3: "FSDP2 FULL_SHARD"}

# Keys that tune DeepSpeed's own machinery (buckets, overlap, monitors): nothing to do under FSDP2.
NO_EFFECT = frozenset({
    "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "prescale_gradients",
    "gradient_predivide_factor", "communication_data_type", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler",
    "comms_logger", "data_types", "seq_parallel_communication_data_type", "bf16.immediate_grad_update",
    "fp16.auto_cast", "fp16.hysteresis", "fp16.min_loss_scale", "fp16.consecutive_hysteresis", "fp16.fp16_master_weights_and_grads",
    *(f"zero_optimization.{key}" for key in (
        "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
        "contiguous_gradients", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "sub_group_size",
        "round_robin_gradients", "elastic_checkpoint", "ignore_unused_parameters", "memory_efficient_linear",
        "load_from_fp32_weights", "cpu_offload_params", "cpu_offload_use_pin_memory", "use_multi_rank_bucket_allreduce",
        "stage3_module_granularity_threshold", "log_trace_cache_warnings")),
    *(f"zero_optimization.{block}.{key}" for block in ("offload_optimizer", "offload_param") for key in (
        "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "fast_init", "ratio", "pipeline_read",
        "pipeline_write")),
})
# Features with no FSDP2 equivalent: refused before training, with the reason.
REFUSED = {
    "amp": "Apex AMP; use the bf16 or fp16 block (torch autocast)",
    "elasticity": "DeepSpeed elastic batch sizing; use trainkit launch --max_restarts for restarts",
    "pipeline": "pipeline parallelism is not part of trainkit",
    "autotuning": "DeepSpeed's autotuner has no FSDP2 counterpart",
    "compression_training": "DeepSpeed's compression library is not part of trainkit",
    "data_efficiency": "DeepSpeed's data-efficiency library is not part of trainkit",
    "curriculum_learning": "DeepSpeed's curriculum learning is not part of trainkit",
    "sparse_attention": "DeepSpeed's sparse attention kernels are not part of trainkit",
    "activation_checkpointing": "DeepSpeed's checkpointing API; use fsdp activation_checkpointing or "
                                "TrainingArguments(gradient_checkpointing=True)",
    "checkpoint": "DeepSpeed-format checkpoint options (universal checkpoints); trainkit writes its own "
                  "reshardable checkpoints",
    "aio": "asynchronous NVMe I/O: FSDP2 offloads to CPU memory only",
    "zero_optimization.zero_hpz_partition_size": "ZeRO++ hierarchical partitioning (use HYBRID_SHARD instead)",
    "zero_optimization.zero_quantized_weights": "ZeRO++ quantized weight communication",
    "zero_optimization.zero_quantized_gradients": "ZeRO++ quantized gradient communication",
    "zero_optimization.zero_quantized_nontrainable_weights": "ZeRO++ quantized weights",
    "zero_optimization.mics_shard_size": "MiCS sharding (use HYBRID_SHARD with a group size instead)",
    "zero_optimization.offload_optimizer.nvme_path": "NVMe offload: FSDP2 offloads to CPU memory only",
    "zero_optimization.offload_param.nvme_path": "NVMe offload: FSDP2 offloads to CPU memory only",
}
# The keys trainkit acts on (nested keys dotted).
ACTED_ON = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "bf16.enabled", "bfloat16.enabled", "fp16.enabled", "fp16.loss_scale",
    "fp16.initial_scale_power", "fp16.loss_scale_window", "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save", "zero_optimization.zero3_init_flag",
})


@dataclasses.dataclass
class AutoValues:
    """What fills ``"auto"``: the settings of the Accelerator or TrainingArguments using the config.

    A value left None stays unresolved until the engine knows it (the micro-batch size, from the first
    prepared dataloader); a key still ``"auto"`` then is an error naming it.
    """

    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    micro_batch_size: int | None = None
    world_size: int | None = None
    learning_rate: float | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    warmup_steps: int | None = None
    total_steps: int | None = None


@dataclasses.dataclass
class DeepSpeedSettings:
    """A DeepSpeed config translated: what trainkit's engine does instead (see module doc)."""

    zero_stage: int = 0
    fsdp_config: dict[str, Any] | None = None
    """Accelerate ``fsdp_config`` keys for stages 2 and 3; None for 0 and 1."""
    shard_optimizer_state: bool = False
    mixed_precision: str | None = None
    scaler_kwargs: dict[str, Any] | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    micro_batch_size: int | None = None
    train_batch_size: int | None = None
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    no_effect: list[str] = dataclasses.field(default_factory=list)
    mapping: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(DeepSpeed key, the trainkit setting it became), for ``trainkit config --show``."""
    deepspeed_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The config as given (Accelerate scripts read ``deepspeed_plugin.deepspeed_config``)."""

    def notice(self) -> str | None:
        """One line naming the accepted keys that change nothing under FSDP2, or None."""
        if not self.no_effect:
            return None
        return "trainkit: these DeepSpeed keys have no effect on FSDP2/DDP (they tune DeepSpeed's internals, or ask " \
            "for nothing at this stage): " + ", ".join(sorted(self.no_effect)) + "."


def read_deepspeed_config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config as a dict: a mapping as it is, or a JSON (or YAML) file's content."""
    if isinstance(source, Mapping):
        return json.loads(json.dumps(source))  # a deep copy that also rejects non-JSON values
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConfigError(f"DeepSpeed config file {str(source)!r} not found.")
    text = path.read_text()
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        loaded = yaml.safe_load(text)
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"DeepSpeed config {str(source)!r} must hold a mapping, got {type(loaded).__name__}.")
    return dict(loaded)


def translate(config: Mapping[str, Any], auto: AutoValues, *, where: str = "DeepSpeed config") -> DeepSpeedSettings:
    """Check every key of ``config``, fill ``"auto"`` from ``auto``, and map it (see module doc)."""
    flat = _flatten(config)
    _refuse(flat, where)
    settings = DeepSpeedSettings(no_effect=sorted(key for key in flat if _is_no_effect(key)),
                                 deepspeed_config=json.loads(json.dumps(config)))
    for key in flat:
        if key not in ACTED_ON and not _is_no_effect(key) and key not in REFUSED and key.split(".")[0] not in REFUSED:
            block = key.rpartition(".")[0]
            siblings = [k for k in ACTED_ON | NO_EFFECT | set(REFUSED) if k.rpartition(".")[0] == block]
            siblings += ["zero_optimization", "bf16", "fp16"] if not block else []
            raise unknown_key_error(key, sorted(siblings), where=where)
    _map_zero(config.get("zero_optimization") or {}, settings, where)
    _map_precision(config, auto, settings, where)
    _map_batches(config, auto, settings, where)
    settings.optimizer = _map_optimizer(config.get("optimizer"), auto, where)
    settings.scheduler = _map_scheduler(config.get("scheduler"), auto, where)
    for name, value in (("optimizer", settings.optimizer), ("scheduler", settings.scheduler)):
        if value is not None:
            settings.mapping.append((f"{name}.type", f"torch {value['type']} ({name} built by trainkit)"))
    return settings


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name in ("zero_optimization", "zero_optimization.offload_optimizer",
                                                   "zero_optimization.offload_param", "bf16", "bfloat16", "fp16"):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _is_no_effect(key: str) -> bool:
    return key in NO_EFFECT or key.split(".")[0] in NO_EFFECT


def _refuse(flat: Mapping[str, Any], where: str) -> None:
    for key, value in flat.items():
        reason = REFUSED.get(key) or REFUSED.get(key.split(".")[0])
        if reason and _asks_for_something(value):
            raise ConfigError(f"DeepSpeed key {key!r} in {where} cannot run on trainkit's FSDP2 engine: {reason}.")
    for block in ("offload_optimizer", "offload_param"):
        device = str(flat.get(f"zero_optimization.{block}.device", "none")).lower()
        if device == "nvme":
            raise ConfigError(f"zero_optimization.{block}.device 'nvme' in {where}: NVMe offload has no FSDP2 "
                              "counterpart (FSDP2 offloads to CPU memory); use 'cpu'.")
        check_choice(f"zero_optimization.{block}.device", device, ("none", "cpu", "nvme"), where=where)


def _asks_for_something(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_asks_for_something(v) for key, v in value.items() if key != "enabled") or bool(value.get("enabled"))
    if isinstance(value, str):
        return value.strip().lower() not in ("", "none", "false", "0")
    if isinstance(value, bool) or value is None:
        return bool(value)
    return value not in (0, 1, -1)  # sizes of 1 (hpz) or -1 (MiCS) mean "off"


def _map_zero(zero: Mapping[str, Any], settings: DeepSpeedSettings, where: str) -> None:
    stage = zero.get("stage", 0)
    if str(stage) not in ("0", "1", "2", "3"):
        raise ConfigError(f"zero_optimization.stage {stage!r} in {where}: ZeRO stages are 0, 1, 2 and 3.")
    settings.zero_stage = int(stage)
    settings.mapping.append(("zero_optimization.stage", STAGE_MEANING[settings.zero_stage]))
    offload_optimizer = str((zero.get("offload_optimizer") or {}).get("device", "none")).lower() == "cpu"
    offload_param = str((zero.get("offload_param") or {}).get("device", "none")).lower() == "cpu"
    if offload_optimizer != offload_param:
        only = "offload_optimizer" if offload_optimizer else "offload_param"
        raise ConfigError(
            f"zero_optimization.{only} to cpu alone in {where}: FSDP2's CPU offload moves parameters, gradients "
            "and optimizer state together. Offload both (offload_param and offload_optimizer device 'cpu', "
            "with stage 3) or neither.")
    if offload_param and settings.zero_stage != 3:
        raise ConfigError(f"CPU offload in {where} needs zero_optimization.stage 3 (as in DeepSpeed, where "
                          f"parameter offload exists only at stage 3); got stage {settings.zero_stage}.")
    settings.shard_optimizer_state = settings.zero_stage == 1
    if settings.zero_stage < 2:
        if _truthy(zero.get("zero3_init_flag")):  # as Accelerate warns: meta-device init needs sharded parameters
            settings.no_effect.append("zero_optimization.zero3_init_flag (stages 0 and 1 keep whole replicas)")
        return
    gather = zero.get("stage3_gather_16bit_weights_on_model_save", zero.get("stage3_gather_fp16_weights_on_model_save"))
    full = settings.zero_stage == 2 or _truthy(gather)
    settings.fsdp_config = {
        "fsdp_sharding_strategy": "FULL_SHARD" if settings.zero_stage == 3 else "SHARD_GRAD_OP",
        "fsdp_offload_params": offload_param,
        "fsdp_state_dict_type": "FULL_STATE_DICT" if full else "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": _truthy(zero.get("zero3_init_flag")),
        "fsdp_sync_module_states": True,
    }
    if offload_param:
        settings.mapping.append(("zero_optimization.offload_param/offload_optimizer", "fsdp_offload_params: true"))
    if settings.fsdp_config["fsdp_cpu_ram_efficient_loading"]:
        settings.mapping.append(("zero_optimization.zero3_init_flag", "fsdp_cpu_ram_efficient_loading: true"))
    settings.mapping.append(("zero_optimization.stage3_gather_16bit_weights_on_model_save",
                             f"fsdp_state_dict_type: {settings.fsdp_config['fsdp_state_dict_type']}"))


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value) and value != "auto"


def _map_precision(config: Mapping[str, Any], auto: AutoValues, settings: DeepSpeedSettings, where: str) -> None:
    bf16 = _enabled(config.get("bf16", config.get("bfloat16")), auto.mixed_precision == "bf16")
    fp16 = _enabled(config.get("fp16"), auto.mixed_precision == "fp16")
    if bf16 and fp16:
        raise ConfigError(f"{where} enables both bf16 and fp16; choose one.")
    chosen = "bf16" if bf16 else "fp16" if fp16 else None
    if chosen is None and config.get("bf16", config.get("fp16")) is None:
        chosen = auto.mixed_precision if auto.mixed_precision not in (None, "no") else None
    if auto.mixed_precision not in (None, "no") and chosen not in (None, auto.mixed_precision):
        raise ConfigError(f"{where} asks for {chosen} but mixed_precision is {auto.mixed_precision!r}: make them agree "
                          "(or write \"auto\" in the DeepSpeed config).")
    settings.mixed_precision = chosen or "no"
    settings.mapping.append(("bf16/fp16.enabled", f"mixed_precision: {settings.mixed_precision}"))
    block = config.get("fp16") or {}
    if isinstance(block, Mapping) and block:
        if float(block.get("loss_scale", 0) or 0) > 0:
            raise ConfigError(f"fp16.loss_scale {block['loss_scale']} in {where}: a static loss scale has no "
                              "counterpart in torch's GradScaler; use 0 (dynamic scaling).")
        scaler: dict[str, Any] = {}
        if "initial_scale_power" in block:
            scaler["init_scale"] = 2.0 ** int(block["initial_scale_power"])
        if "loss_scale_window" in block:
            scaler["growth_interval"] = int(block["loss_scale_window"])
        settings.scaler_kwargs = scaler or None


def _enabled(block: Any, auto_value: bool) -> bool:
    value = block.get("enabled", False) if isinstance(block, Mapping) else block
    return auto_value if value == "auto" else _truthy(value)


def _map_batches(config: Mapping[str, Any], auto: AutoValues, settings: DeepSpeedSettings, where: str) -> None:
    steps = _fill(config.get("gradient_accumulation_steps"), auto.gradient_accumulation_steps)
    clip = _fill(config.get("gradient_clipping"), auto.gradient_clipping)
    micro = _fill(config.get("train_micro_batch_size_per_gpu"), auto.micro_batch_size)
    total = _fill(config.get("train_batch_size"), None)
    settings.gradient_accumulation_steps = None if steps in (None, "auto") else int(steps)
    settings.gradient_clipping = None if clip in (None, "auto") else float(clip)
    settings.micro_batch_size = None if micro in (None, "auto") else int(micro)
    settings.train_batch_size = None if total in (None, "auto") else int(total)
    micro_size, world = settings.micro_batch_size, auto.world_size
    if settings.train_batch_size is not None and micro_size is not None and world is not None:
        expected = micro_size * (settings.gradient_accumulation_steps or 1) * world
        if expected != settings.train_batch_size:
            raise ConfigError(
                f"train_batch_size {settings.train_batch_size} in {where} must equal train_micro_batch_size_per_gpu "
                f"({settings.micro_batch_size}) x gradient_accumulation_steps ({settings.gradient_accumulation_steps or 1})"
                f" x processes ({auto.world_size}) = {expected}.")
    for key, target in (("gradient_accumulation_steps", f"gradient_accumulation_steps: {settings.gradient_accumulation_steps}"),
                        ("gradient_clipping", f"clip to norm {settings.gradient_clipping} before each optimizer step"),
                        ("train_micro_batch_size_per_gpu", "checked against the prepared dataloader's batch size")):
        if key in config:
            settings.mapping.append((key, target))


def _fill(value: Any, auto_value: Any) -> Any:
    return auto_value if value == "auto" else value


def _map_optimizer(block: Any, auto: AutoValues, where: str) -> dict[str, Any] | None:
    if not block:
        return None
    kind = check_choice("optimizer.type", str(block.get("type")), OPTIMIZERS, where=where)
    params = dict(block.get("params") or {})
    filled = {"lr": auto.learning_rate, "betas": auto.betas, "eps": auto.eps, "weight_decay": auto.weight_decay}
    params = {key: filled.get(key) if value == "auto" else value for key, value in params.items()}
    params.pop("torch_adam", None)  # selects DeepSpeed's kernel, not the maths
    if kind == "Adam" and params.pop("adam_w_mode", True):
        kind = "AdamW"  # DeepSpeed's Adam decouples weight decay unless adam_w_mode is false
    return {"type": kind, "params": params}  # None: "auto" still to fill (from DummyOptim's lr/weight_decay)


def _map_scheduler(block: Any, auto: AutoValues, where: str) -> dict[str, Any] | None:
    if not block:
        return None
    kind = check_choice("scheduler.type", str(block.get("type")), SCHEDULERS, where=where)
    params = dict(block.get("params") or {})
    filled = {"warmup_min_lr": 0.0, "warmup_max_lr": auto.learning_rate, "warmup_num_steps": auto.warmup_steps,
              "total_num_steps": auto.total_steps}
    params = {key: filled.get(key) if value == "auto" else value for key, value in params.items()}
    return {"type": kind, "params": params}


# DeepSpeedPlugin fields (the keys of an Accelerate YAML's deepspeed_config block) and the DeepSpeed JSON
# key each one sets: the pairs Accelerate itself matches when both a plugin field and a config file are given.
FIELD_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_init_flag": "zero_optimization.zero3_init_flag",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
_OLD_SPELLINGS = {"zero_optimization.stage3_gather_16bit_weights_on_model_save":
                  "zero_optimization.stage3_gather_fp16_weights_on_model_save"}


def merge_plugin_fields(config: dict[str, Any], fields: Mapping[str, Any], *, file_where: str,
                        fields_where: str = "the DeepSpeedPlugin / deepspeed_config block") -> None:
    """Merge plugin fields (or YAML ``deepspeed_config`` keys) into a DeepSpeed config read from a file.

    A field fills its JSON key where the file leaves it out or writes ``"auto"``; a field that says the
    same as the file is accepted; a field that says something else is a real conflict, refused with both
    values and the file's name. (Accelerate's launcher refuses the JSON-backed keys beside a file outright,
    even when they agree; ``accelerate config`` writes only ``zero3_init_flag`` and launcher keys there.)
    """
    for name, value in fields.items():
        if name not in FIELD_KEYS or value is None or _means_off(name, value):
            if name in FIELD_KEYS and value is not None:
                _check_off_agrees(config, name, value, file_where=file_where, fields_where=fields_where)
            continue
        key = FIELD_KEYS[name]
        present = _get_dotted(config, key)
        if present is None and key in _OLD_SPELLINGS:
            present = _get_dotted(config, _OLD_SPELLINGS[key])
        if present is None or present == "auto":
            _set_dotted(config, key, value)
        elif not _same_value(present, value):
            raise _conflict(name, value, key, present, file_where, fields_where)


def _means_off(name: str, value: Any) -> bool:
    """A field value that asks for nothing (Accelerate writes these as defaults): never fills the file."""
    if name.endswith("_device") or name.endswith("_nvme_path"):
        return str(value).strip().lower() in ("", "none")
    if name in ("zero3_init_flag", "zero3_save_16bit_model"):
        return not _truthy(value)
    return False


def _check_off_agrees(config: Mapping[str, Any], name: str, value: Any, *, file_where: str, fields_where: str) -> None:
    """An "off" field (device none, flag false) conflicts only with a file that turns the thing on."""
    key = FIELD_KEYS[name]
    present = _get_dotted(config, key)
    if present is None and key in _OLD_SPELLINGS:
        present = _get_dotted(config, _OLD_SPELLINGS[key])
    if name.endswith("_nvme_path") or present is None or present == "auto":
        return  # a path is only read with an nvme device, and that device is compared on its own
    if name.endswith("_device"):
        on = str(present).strip().lower() not in ("", "none")
    else:
        on = _truthy(present)
    if on:
        raise _conflict(name, value, key, present, file_where, fields_where)


def _same_value(present: Any, value: Any) -> bool:
    if isinstance(value, bool) or isinstance(present, bool):
        return _truthy(present) == _truthy(value)
    try:
        return float(present) == float(value)
    except (TypeError, ValueError):
        return str(present).strip().lower() == str(value).strip().lower()


def _conflict(name: str, value: Any, key: str, present: Any, file_where: str, fields_where: str) -> ConfigError:
    return ConfigError(
        f"{name} is {value!r} in {fields_where} but {key} is {present!r} in the DeepSpeed config {file_where}: "
        f"set it in one place, make the two agree, or write \"auto\" in the file.")


def _get_dotted(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    *blocks, last = key.split(".")
    node = config
    for part in blocks:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


@dataclasses.dataclass
class DeepSpeedPlugin:
    """Accelerate's ``DeepSpeedPlugin`` (same fields): a DeepSpeed config that trainkit runs on FSDP2.

    Either ``hf_ds_config`` (a DeepSpeed JSON path or dict, ``"auto"`` values allowed) or the plugin's own
    fields, which are the keys of an Accelerate YAML's ``deepspeed_config:`` block. The config is read
    and checked here; the engine translates it (:func:`translate`) once it knows the values ``"auto"``
    stands for.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.enable_msamp:
            raise ConfigError("DeepSpeedPlugin(enable_msamp=True): MS-AMP FP8 training has no FSDP2 counterpart here.")
        if self.transformer_moe_cls_names:
            raise ConfigError("DeepSpeedPlugin(transformer_moe_cls_names=...): DeepSpeed's MoE leaf modules have no "
                              "FSDP2 counterpart in trainkit.")
        self.deepspeed_config = self._build()

    def _file_config(self) -> dict[str, Any]:
        """The file's config with the plugin's fields merged in (see :func:`merge_plugin_fields`)."""
        config = read_deepspeed_config(self.hf_ds_config)
        where = "(dict)" if isinstance(self.hf_ds_config, Mapping) else str(self.hf_ds_config)
        given = {name: getattr(self, name) for name in FIELD_KEYS if getattr(self, name) is not None}
        merge_plugin_fields(config, given, file_where=where)
        for name, key in FIELD_KEYS.items():  # as in Accelerate: the fields then read what the file says
            value = _get_dotted(config, key)
            if getattr(self, name) is None and value is not None and value != "auto":
                setattr(self, name, value)
        return config

    def _build(self) -> dict[str, Any]:
        if self.hf_ds_config is not None:
            return self._file_config()
        zero: dict[str, Any] = {"stage": 2 if self.zero_stage is None else int(self.zero_stage)}
        for block, device, nvme in (("offload_optimizer", self.offload_optimizer_device, self.offload_optimizer_nvme_path),
                                    ("offload_param", self.offload_param_device, self.offload_param_nvme_path)):
            if device not in (None, "none") or nvme:
                zero[block] = {"device": device or "none", **({"nvme_path": nvme} if nvme else {})}
        if self.zero3_init_flag:
            zero["zero3_init_flag"] = True
        if self.zero3_save_16bit_model is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = bool(self.zero3_save_16bit_model)
        config: dict[str, Any] = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": self.gradient_accumulation_steps or "auto",
                  "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
        if self.gradient_clipping is not None:
            config["gradient_clipping"] = float(self.gradient_clipping)
        return config


_PLUGIN_FIELD_KEYS = tuple(FIELD_KEYS)
DEEPSPEED_YAML_OPTIONS = {
    "zero_stage": Option(help="ZeRO stage 0-3 (3 = FSDP2 FULL_SHARD, 2 = SHARD_GRAD_OP, 1 = sharded optimizer state).",
                         parse=integer(0)),
    "offload_optimizer_device": Option(help="none | cpu (with --offload_param_device cpu and stage 3)."),
    "offload_param_device": Option(help="none | cpu (with --offload_optimizer_device cpu and stage 3)."),
    "offload_optimizer_nvme_path": Option(help="Refused: FSDP2 offloads to CPU memory only."),
    "offload_param_nvme_path": Option(help="Refused: FSDP2 offloads to CPU memory only."),
    "gradient_accumulation_steps": Option(help="Micro-batches per optimizer step (the launch key of the same name "
                                          "sets it from the command line).", parse=integer(1), flag=False),
    "gradient_clipping": Option(help="Clip gradients to this total norm before each optimizer step.",
                                parse=lambda value, key, where: float(value)),
    "zero3_init_flag": Option(help="true: build the model on the meta device, rank 0 loads the weights.",
                              parse=boolean),
    "zero3_save_16bit_model": Option(help="true: save full (gathered) weights instead of shards.", parse=boolean),
    "deepspeed_config_file": Option(help="A DeepSpeed JSON config (\"auto\" values allowed)."),
    "deepspeed_hostfile": Option(help="Refused: DeepSpeed's launcher; use --num_machines/--main_process_ip."),
    "deepspeed_multinode_launcher": Option(help="Only 'standard' (torchrun on each machine)."),
    "deepspeed_inclusion_filter": Option(help="Refused: DeepSpeed's launcher."),
    "deepspeed_exclusion_filter": Option(help="Refused: DeepSpeed's launcher."),
    "deepspeed_moe_layer_cls_names": Option(help="Refused: DeepSpeed's MoE leaf modules."),
    "transformer_moe_cls_names": Option(help="Refused: DeepSpeed's MoE leaf modules (the plugin's field name).",
                                        flag=False),
}
"""The keys of an Accelerate YAML's ``deepspeed_config:`` block, declared once: the YAML reader, the launcher's
``--<key>`` flags (those with ``flag``) and their help read this table."""
ACCELERATE_YAML_KEYS = tuple(DEEPSPEED_YAML_OPTIONS)


def plugin_from_yaml_block(block: Mapping[str, Any], *, where: str) -> DeepSpeedPlugin:
    """The ``deepspeed_config:`` block of an Accelerate launch YAML as a :class:`DeepSpeedPlugin`."""
    check_keys(block, DEEPSPEED_YAML_OPTIONS, where=where)
    launcher = block.get("deepspeed_multinode_launcher")
    if launcher not in (None, "standard"):
        raise ConfigError(f"deepspeed_multinode_launcher {launcher!r} in {where}: trainkit starts machines with "
                          "torchrun (Accelerate's 'standard'); run `trainkit launch` on each machine instead of "
                          "pdsh/openmpi/mvapich.")
    for key in ("deepspeed_hostfile", "deepspeed_inclusion_filter", "deepspeed_exclusion_filter"):
        if block.get(key) not in (None, "", "none"):
            raise ConfigError(f"{key} in {where} belongs to DeepSpeed's own launcher; trainkit launch uses "
                              "--num_machines/--machine_rank/--main_process_ip instead.")
    moe = block.get("deepspeed_moe_layer_cls_names") or block.get("transformer_moe_cls_names")
    fields = {key: DEEPSPEED_YAML_OPTIONS[key].read(block[key], key, where)  # YAML values, or flag text
              for key in _PLUGIN_FIELD_KEYS if block.get(key) is not None}
    config_file = block.get("deepspeed_config_file")
    if config_file not in (None, "", "none"):
        # Checked here first so that a conflict names this YAML block rather than the plugin.
        merge_plugin_fields(read_deepspeed_config(config_file), fields, file_where=str(config_file), fields_where=where)
        return DeepSpeedPlugin(hf_ds_config=config_file, transformer_moe_cls_names=moe, **fields)
    return DeepSpeedPlugin(transformer_moe_cls_names=moe, **fields)


def engine_values(config: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """What a DeepSpeed config asks of the engine, as engine-config keys (``trainkit.config.engine``).

    Only what the config states counts: ``"auto"`` and absent keys are left out, so the run's other
    settings fill them by the usual precedence. ``"deepspeed"`` carries the translated config itself
    (clipping, optimizer and scheduler blocks, batch sizes, fp16 scaler settings, the mapping).
    """
    settings = translate(config, AutoValues(), where=where)
    values: dict[str, Any] = {"deepspeed": settings, "fsdp": settings.fsdp_config is not None}
    for key, value in (settings.fsdp_config or {}).items():
        values["fsdp." + key[len("fsdp_"):]] = value
    for name in ("bf16", "fp16"):
        block = config.get(name, config.get("bfloat16") if name == "bf16" else None)
        enabled = block.get("enabled") if isinstance(block, Mapping) else block
        if enabled is not None and enabled != "auto" and _truthy(enabled):
            values["mixed_precision"] = name
    if settings.gradient_accumulation_steps is not None:
        values["gradient_accumulation_steps"] = settings.gradient_accumulation_steps
    return values
