"""TrainingArguments carries every field of the installed transformers' TrainingArguments (CPU only).

Each field, set to a non-default valid value, either constructs or fails with the reason documented here
(a package, hardware or integration that is absent): never "unknown argument".
"""

import dataclasses
import importlib.util
import json
import logging
import os
import warnings

import pytest
import torch
import transformers

from trainkit import TrainingArguments
from trainkit.config.errors import ConfigError
from trainkit.trainer.training_arguments import fields as argument_fields
from trainkit.trainer.training_arguments.fields import NEWEST_KNOWN_TRANSFORMERS, field_drift, model_checkpointing_options

HF_FIELDS = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
OUR_FIELDS = {f.name: f for f in dataclasses.fields(TrainingArguments)}
HF_DEFAULTS = {name: argument_fields.declared_default(f) for name, f in HF_FIELDS.items()}

# One non-default, valid value per field. Extra keywords a value needs to be coherent go in COMPANIONS.
NON_DEFAULT = {
    "output_dir": "out", "per_device_train_batch_size": 4, "num_train_epochs": 2.0, "max_steps": 7,
    "learning_rate": 1e-3, "lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycles": 0.25},
    "warmup_steps": 0.1, "optim": "sgd", "optim_args": "momentum=0.9", "weight_decay": 0.01, "adam_beta1": 0.8,
    "adam_beta2": 0.99, "adam_epsilon": 1e-6, "optim_target_modules": ["attn"], "gradient_accumulation_steps": 2,
    "average_tokens_across_devices": False, "max_grad_norm": 0.5, "label_smoothing_factor": 0.1, "bf16": True,
    "fp16": True, "bf16_full_eval": True, "fp16_full_eval": True, "tf32": True, "activation_checkpointing": True,
    "activation_checkpointing_kwargs": {"use_reentrant": False}, "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False}, "torch_compile": True,
    "torch_compile_backend": "eager", "torch_compile_mode": "default", "use_liger_kernel": True,
    "liger_kernel_config": {"rope": True}, "use_cache": True, "neftune_noise_alpha": 5.0,
    "torch_empty_cache_steps": 10, "auto_find_batch_size": True, "logging_strategy": "epoch", "logging_steps": 10,
    "logging_first_step": True, "log_on_each_node": False, "logging_nan_inf_filter": False,
    "include_num_input_tokens_seen": "non_padding", "log_level": "info", "log_level_replica": "error",
    "disable_tqdm": True, "report_to": "tensorboard", "run_name": "run", "project": "mine",
    "trackio_space_id": "me/space", "trackio_bucket_id": "me/bucket", "trackio_static_space_id": "me/static",
    "eval_strategy": "epoch", "eval_steps": 5, "eval_delay": 1, "per_device_eval_batch_size": 16,
    "prediction_loss_only": True, "eval_on_start": True, "eval_do_concat_batches": False,
    "eval_use_gather_object": True, "eval_accumulation_steps": 2, "include_for_metrics": ["inputs"],
    "batch_eval_metrics": True, "save_only_model": True, "save_strategy": "epoch", "save_steps": 10,
    "save_on_each_node": True, "async_save": True, "async_save_when_busy": "skip", "save_total_limit": 2,
    "checkpoint_dir": "memory://bucket/run",
    "enable_jit_checkpoint": True, "push_to_hub": True,
    "hub_token": "hf_x", "hub_private_repo": True, "hub_model_id": "me/model", "hub_strategy": "end",
    "hub_always_push": True, "hub_revision": "dev", "load_best_model_at_end": True, "metric_for_best_model": "accuracy",
    "greater_is_better": True, "ignore_data_skip": True, "restore_callback_states_from_checkpoint": True,
    "full_determinism": True, "seed": 7, "data_seed": 8, "use_cpu": True,
    "accelerator_config": {"even_batches": False}, "parallelism_config": object(), "dataloader_drop_last": True,
    "dataloader_num_workers": 2, "dataloader_pin_memory": False, "dataloader_persistent_workers": True,
    "dataloader_prefetch_factor": 4, "dataloader_multiprocessing_context": "spawn", "dataloader_in_order": False,
    "remove_unused_columns": False, "label_names": ["target"], "train_sampling_strategy": "group_by_length",
    "length_column_name": "n_tokens", "ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 50,
    "ddp_broadcast_buffers": False, "ddp_static_graph": True, "ddp_backend": "gloo", "ddp_timeout": 60,
    "fsdp": "full_shard", "fsdp_config": {"min_num_params": 1000}, "deepspeed": {"zero_optimization": {"stage": 2}},
    "debug": "underflow_overflow", "skip_memory_metrics": False, "do_train": True, "do_eval": True,
    "do_predict": True, "resume_from_checkpoint": "out/checkpoint-5", "local_rank": 0,
    # transformers 5.1's names, mapped onto their later spelling (older_fields.py)
    "warmup_ratio": 0.1, "group_by_length": True, "logging_dir": "tb",
}
COMPANIONS = {
    "load_best_model_at_end": {"eval_strategy": "epoch", "save_strategy": "epoch"},
    "dataloader_persistent_workers": {"dataloader_num_workers": 1},
    "dataloader_prefetch_factor": {"dataloader_num_workers": 1},
    "dataloader_multiprocessing_context": {"dataloader_num_workers": 1},
    "dataloader_in_order": {"dataloader_num_workers": 1},
    "liger_kernel_config": {"use_liger_kernel": True},
    # transformers refuses bf16 on a CPU-only machine unless use_cpu says so (trainkit runs bf16 on CPU either way);
    # the oracle's machine is CPU-only.
    "bf16": {"use_cpu": True}, "bf16_full_eval": {"use_cpu": True},
}
# Defaults that differ from transformers' on purpose (docs/migrating-from-transformers.md says why).
DOCUMENTED_DEFAULTS = {
    "enable_jit_checkpoint": None,  # None: save on preemption whenever checkpoints are written (#13); False: off
    # Version-dependent: transformers 5.1 declares 'trackio' (the Space its Trackio callback deploys to), later
    # releases None. Harmless: only report_to='trackio' reads it, and trainkit drives no Trackio tracker.
    "trackio_space_id": None,
}
CPU_ONLY = not torch.cuda.is_available()
# Fields whose non-default value needs something absent: the error must name it.
REFUSED = {
    "optim_target_modules": "GaLore/APOLLO",
    "parallelism_config": "ParallelismConfig",
    "trackio_space_id": "Trackio", "trackio_bucket_id": "Trackio", "trackio_static_space_id": "Trackio",
}
try:
    import liger_kernel  # noqa: F401
except ImportError:
    REFUSED.update(use_liger_kernel="liger-kernel package", liger_kernel_config="liger-kernel package")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
    REFUSED.setdefault("tf32", "Ampere")


class TransformersFieldDrift(UserWarning):
    """The installed transformers is newer than trainkit knows and its TrainingArguments differ (listed)."""


def test_every_transformers_field_exists_with_its_default():
    """The installed transformers' dataclass is the oracle. Policy (docs/migrating-from-transformers.md): for a release
    up to the newest trainkit knows, any missing field or differing default fails; for a newer release the
    differences are listed in a warning, so a fresh install of a new transformers does not turn the suite red."""
    drift = field_drift(TrainingArguments)
    documented = {name for name in drift.defaults if name in DOCUMENTED_DEFAULTS}
    for name in documented:
        assert argument_fields.declared_default(OUR_FIELDS[name]) == DOCUMENTED_DEFAULTS[name], name
        del drift.defaults[name]
    if drift.is_complete:
        return
    if drift.newer_than_known:
        warnings.warn(TransformersFieldDrift(drift.report()), stacklevel=1)
        return
    pytest.fail(drift.report())


def test_a_newer_transformers_field_is_listed_and_named_when_used(monkeypatch):
    """A stand-in for a newer release: transformers' own dataclass plus one field and one changed default."""
    newer = dataclasses.make_dataclass(
        "NewerTrainingArguments", [("brand_new_knob", int, dataclasses.field(default=3)),
                                   ("seed", int, dataclasses.field(default=0))],
        bases=(transformers.TrainingArguments,))
    drift = field_drift(TrainingArguments, newer, version="99.0.0")
    undocumented = {name: pair for name, pair in drift.defaults.items() if name not in DOCUMENTED_DEFAULTS}
    assert drift.unknown == {"brand_new_knob": 3} and undocumented == {"seed": (42, 0)}
    assert drift.newer_than_known and not drift.is_complete
    report = drift.report()
    assert "missing in trainkit: brand_new_knob (default 3)" in report and "default of seed: trainkit 42, transformers 0" in report
    assert not field_drift(TrainingArguments, version=NEWEST_KNOWN_TRANSFORMERS).newer_than_known
    # Used in a script, the new field is refused with the reason, not a bare "unknown argument".
    monkeypatch.setattr(argument_fields, "installed_field_defaults", lambda: {**HF_DEFAULTS, "brand_new_knob": 3})
    with pytest.raises(TypeError, match=r"brand_new_knob.*field of the installed transformers.*does not implement it"):
        TrainingArguments(brand_new_knob=4)


def test_fields_newer_than_the_installed_transformers_are_accepted():
    """activation_checkpointing* exist from transformers 5.23; trainkit accepts them with any installed release."""
    args = TrainingArguments(activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False})
    assert args.activation_checkpointing is args.gradient_checkpointing is True
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert TrainingArguments().gradient_checkpointing is False  # the default of every transformers release


def test_per_layer_checkpointing_options_need_the_transformers_that_has_them():
    options = {"every_n_layers": 2, "offload": True}
    if set(options) <= model_checkpointing_options():
        assert TrainingArguments(activation_checkpointing=True, activation_checkpointing_kwargs=options)
    else:
        with pytest.raises(ConfigError, match=r"every_n_layers=2, offload=True .*needs transformers >= 5\.16"):
            TrainingArguments(activation_checkpointing=True, activation_checkpointing_kwargs=options)
    TrainingArguments(activation_checkpointing_kwargs=options)  # inactive without activation_checkpointing


def test_the_non_default_table_covers_every_field():
    assert set(NON_DEFAULT) == set(OUR_FIELDS)


# For the oracle: names trainkit accepts that the installed transformers spells another way (the same setting).
SPELLINGS = {"warmup_ratio": "warmup_steps", "group_by_length": "train_sampling_strategy",
             "activation_checkpointing": "gradient_checkpointing",
             "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs",
             "train_sampling_strategy": "group_by_length"}
SPELLED_VALUES = {("group_by_length", "train_sampling_strategy"): {True: "group_by_length"},
                  ("train_sampling_strategy", "group_by_length"): {"group_by_length": True}}
# Serialised values that differ on purpose (docs/migrating-from-transformers.md), by field:
SERIALISED_DIFFERENTLY = {
    "fsdp": "trainkit keeps the parsed words (a list); transformers 5.24 records True and moves the words into "
            "fsdp_config (the resolved options are TrainingArguments.fsdp_options)",
    "fsdp_config": "trainkit keeps the configuration as given; transformers fills in its defaults",
    "enable_jit_checkpoint": "None: save on preemption whenever checkpoints are written (transformers: False)",
    "trackio_space_id": "version-dependent default (DOCUMENTED_DEFAULTS)",
}
if importlib.util.find_spec("accelerate") is None:  # transformers' own Trainer needs it; the gpu-image/oldest stacks lack it
    SERIALISED_DIFFERENTLY["accelerator_config"] = "transformers fills it in only when Accelerate is installed"
NO_ORACLE = {"deepspeed": "transformers accepts deepspeed= only with the deepspeed package installed; trainkit runs "
                          "the config on FSDP2/DDP without it"}


def _oracle_kwargs(kwargs: dict) -> dict:
    """``kwargs`` as the installed transformers spells them: a name it lacks takes its other spelling, or is left
    out when it has none (trainkit's own fields, and fields newer than the installed release)."""
    spelled = {}
    for key, value in kwargs.items():
        if key in HF_FIELDS:
            spelled[key] = value
        elif SPELLINGS.get(key) in HF_FIELDS:
            other = SPELLINGS[key]
            spelled[other] = SPELLED_VALUES.get((key, other), {}).get(value, value) if isinstance(value, (str, bool)) \
                else value
    return spelled


def _plain(value):
    """transformers keeps some values as dataclasses where Accelerate is absent: compare their fields."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def _serialisations(args) -> dict[str, dict]:
    return {"to_dict": {k: _plain(v) for k, v in args.to_dict().items()},
            "to_json_string": json.loads(args.to_json_string()),
            "to_sanitized_dict": args.to_sanitized_dict()}


@pytest.mark.parametrize("name", sorted(OUR_FIELDS))
def test_each_field_serialises_as_transformers_does(name, tmp_path, monkeypatch):
    """Set to a non-default value, each field constructs (or fails naming what it needs), and trainkit's to_dict(),
    to_json_string() and to_sanitized_dict() equal those of the installed transformers' TrainingArguments built with
    the same keywords (tests/trainer/transformers_oracle.py), every field's value compared, bar the listed ones."""
    from tests.trainer.transformers_oracle import transformers_arguments

    monkeypatch.chdir(tmp_path)
    kwargs = {"output_dir": "out", name: NON_DEFAULT[name], **COMPANIONS.get(name, {})}
    if name == "push_to_hub":
        kwargs["hub_model_id"] = "me/model"
    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]):
            TrainingArguments(**kwargs)
        return
    ours = TrainingArguments(**kwargs)
    if name in NO_ORACLE:
        pytest.skip(NO_ORACLE[name])
    try:
        theirs = transformers_arguments(**_oracle_kwargs(kwargs))
    except ModuleNotFoundError as missing:  # transformers before 5.24 imports Accelerate for fsdp=
        if missing.name != "accelerate":
            raise
        pytest.skip(f"the installed transformers needs Accelerate (absent here) to accept {name}=")
    for form, our_values in _serialisations(ours).items():
        their_values = _serialisations(theirs)[form]
        compared = (set(our_values) & set(their_values)) - set(SERIALISED_DIFFERENTLY)
        assert {"output_dir", "seed"} <= compared
        if name in their_values and name not in SERIALISED_DIFFERENTLY:
            assert name in compared
        differing = {key: (our_values[key], their_values[key]) for key in sorted(compared)
                     if our_values[key] != their_values[key]}
        assert differing == {}, f"{form}: trainkit's value, transformers' value"


def test_activation_checkpointing_and_its_old_name_are_one_setting():
    assert TrainingArguments(activation_checkpointing=True).gradient_checkpointing is True
    assert TrainingArguments(gradient_checkpointing=True).activation_checkpointing is True
    with pytest.raises(ConfigError, match="name one setting"):
        TrainingArguments(activation_checkpointing=True, gradient_checkpointing=False)


def test_transformers_5_1_fields_map_onto_their_later_spelling_with_a_notice(tmp_path, caplog):
    """CPU, no run: a script written against transformers 5.1 keeps warmup_ratio, group_by_length and logging_dir."""
    from transformers import HfArgumentParser

    from trainkit.trainer.training_arguments import checks as argument_checks

    argument_checks._WARNED.clear()
    older = dict(warmup_ratio=0.25, group_by_length=True, logging_dir="~/tb")
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        args = TrainingArguments(str(tmp_path), **older)
        TrainingArguments(str(tmp_path), **older)  # built twice: each notice once
    assert args.warmup_steps == 0.25 and args.get_warmup_steps(10) == 3  # 5.1: ceil(0.25 * 10)
    assert args.train_sampling_strategy == "group_by_length"
    assert args.logging_dir == os.path.expanduser("~/tb")
    notices = [r.getMessage() for r in caplog.records if "transformers 5.1's name" in r.getMessage()]
    assert len(notices) == 3, notices
    assert "warmup_ratio=0.25" in notices[0] and "warmup_steps=0.25" in notices[0]
    assert "group_by_length=True" in notices[1] and "train_sampling_strategy='group_by_length'" in notices[1]
    assert "logging_dir=" in notices[2] and "TensorBoard" in notices[2]
    # Both spellings with one value (a to_dict() round trip) is one setting, not a conflict.
    again = TrainingArguments(**{k: v for k, v in args.to_dict().items() if k in ("output_dir", "warmup_ratio",
                                                                              "warmup_steps", "group_by_length",
                                                                              "train_sampling_strategy")})
    assert (again.warmup_steps, again.train_sampling_strategy) == (0.25, "group_by_length")
    (parsed,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--warmup_ratio", "0.1", "--group_by_length", "--logging_dir", "tb"])
    assert (parsed.warmup_steps, parsed.train_sampling_strategy, parsed.logging_dir) == (0.1, "group_by_length", "tb")
    defaults = TrainingArguments(str(tmp_path))
    assert (defaults.warmup_steps, defaults.train_sampling_strategy) == (0, "random")


@pytest.mark.parametrize("kwargs, reason", [
    ({"ddp_backend": "hccl"}, "no hccl backend"),
    ({"train_sampling_strategy": "batch_rebalance"}, "shards every sampler"),
    ({"debug": "tpu_metrics_debug"}, "needs a TPU"),
    ({"dataloader_in_order": False}, "dataloader_num_workers > 0"),
    ({"accelerator_config": {"gradient_accumulation_kwargs": {"num_step": 2}}}, "num_steps"),
    ({"accelerator_config": {"split_batch": True}}, "split_batches"),
    ({"group_by_length": True, "train_sampling_strategy": "sequential"}, "group_by_length=True and "
     "train_sampling_strategy='sequential' name one setting with two values"),
    ({"warmup_ratio": 0.1, "warmup_steps": 5}, "warmup_ratio=0.1 and warmup_steps=5 name one setting with two values"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio=1\.0 .* must be in \[0, 1\)"),
])
def test_refusals_name_the_reason(kwargs, reason):
    with pytest.raises((ConfigError, TypeError), match=reason):
        TrainingArguments(**kwargs)


@pytest.mark.skipif(not CPU_ONLY, reason="checks the CPU-only message")
def test_nccl_and_tf32_on_cpu_say_what_they_need():
    with pytest.raises(ConfigError, match="nccl.*NVIDIA GPUs"):
        TrainingArguments(ddp_backend="nccl")
    with pytest.raises(ConfigError, match="Ampere or newer"):
        TrainingArguments(tf32=True)
    TrainingArguments(tf32=False)  # turning TF32 off is meaningful anywhere


def test_process_attributes_scripts_read(tmp_path):
    """CPU, one process: what run_clm.py / run_glue.py read from their arguments."""
    from transformers.training_args import ParallelMode

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=3,
                             per_device_eval_batch_size=5, warmup_steps=0.1, log_level="error")
    assert (args.process_index, args.local_process_index, args.world_size) == (0, 0, 1)
    assert args.device == torch.device("cpu") and args.n_gpu == 0
    assert args.parallel_mode is ParallelMode.NOT_PARALLEL and args.parallel_mode.value == "not_parallel"
    assert args.should_log and args.should_save
    assert args.get_process_log_level() == logging.ERROR
    assert (args.train_batch_size, args.eval_batch_size) == (3, 5)
    assert args.get_warmup_steps(95) == 10
    assert args.ddp_timeout_delta.total_seconds() == 1800
    assert args.ddp_timeout_if_set is None  # transformers' default counts as not set: the launcher's timeout applies
    with args.main_process_first(desc="cache"):
        pass
    assert json.loads(args.to_json_string())["per_device_train_batch_size"] == 3
    assert all(isinstance(v, (bool, int, float, str)) for v in args.to_sanitized_dict().values())


def test_engine_options_from_ddp_fields_and_accelerator_config():
    from trainkit.trainer.training_arguments.engine_settings import engine_options
    from trainkit.utils.dataclasses import DistributedDataParallelKwargs, InitProcessGroupKwargs

    args = TrainingArguments(ddp_find_unused_parameters=True, ddp_timeout=90, data_seed=3,
                             accelerator_config='{"even_batches": false}')
    options = engine_options(args)
    handlers = {type(h): h for h in options["kwargs_handlers"]}
    assert handlers[DistributedDataParallelKwargs].to_kwargs() == {"find_unused_parameters": True}
    assert handlers[InitProcessGroupKwargs].timeout.total_seconds() == 90
    assert options["dataloader_config"].even_batches is False and options["dataloader_config"].data_seed == 3
    assert DistributedDataParallelKwargs not in {type(h) for h in engine_options(TrainingArguments())["kwargs_handlers"]}
