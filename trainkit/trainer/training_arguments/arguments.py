"""TrainingArguments: every knob of the Trainer as one flat dataclass with transformers 5.x names, defaults and meanings.

Construction validates everything a run depends on, so that a typo or a contradiction fails before any model
is built: bad values are named with the valid ones and a did-you-mean, unknown keywords likewise. The engine
never sees this class; the Trainer projects it into ``Accelerator(...)`` arguments.
"""

import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass, field
from collections.abc import Callable, Collection
from typing import Any, ClassVar

from trainkit.config.errors import ConfigError, check_choice, did_you_mean
from trainkit.config.fsdp import SHARDING_STRATEGIES
from trainkit.config.ignored_field import reset_ignored_field
from trainkit.engine import tracker_names
from trainkit.trainer.training_arguments.checks import ProcessAttributes, check_transformers_fields
from trainkit.trainer.training_arguments.fields import check_version_dependent_fields, unknown_field_hint
from trainkit.trainer.training_arguments.setters import ArgumentSetters
from trainkit.trainer import schedules
from trainkit.trainer.optim import BUILT_WITH_TORCH, check_optimizer_name, optimizer_names

logger = logging.getLogger(__name__)

WHERE = "TrainingArguments"

INTERVAL_STRATEGIES = ("no", "steps", "epoch")
SAVE_STRATEGIES = ("no", "steps", "epoch", "best")
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
TOKEN_COUNT_MODES = ("all", "non_padding", "no")
LOG_LEVELS = ("passive", "debug", "info", "warning", "error", "critical")
# The words the string form of `fsdp` may contain (transformers' FSDPOption values): each sharding strategy
# (config/fsdp.py declares them) in lower case, and two flags.
FSDP_SHARDING_WORDS = {strategy.lower(): strategy for strategy in SHARDING_STRATEGIES}
FSDP_FLAG_WORDS = ("offload", "auto_wrap")
# Keyword arguments that transformers 4.x accepted and 5.x renamed: named in the error, not silently mapped.
# (5.1's warmup_ratio, group_by_length and logging_dir are fields, mapped with a notice: see older_fields.py.)
RENAMED_ARGUMENTS = {
    "evaluation_strategy": "eval_strategy",
    "no_cuda": "use_cpu",
    "use_mps_device": "use_cpu=False (the device is picked automatically)",
    "overwrite_output_dir": "nothing: checkpoints never overwrite each other; remove it",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "per_gpu_eval_batch_size": "per_device_eval_batch_size",
}


class UnknownArgumentError(ConfigError, TypeError):
    """A keyword that TrainingArguments does not define (a TypeError too, like any unexpected keyword)."""


def _named_choice(key: str, value: Any, common: Collection[str], every_name: Callable[[], list[str]]) -> str:
    """``value`` (a string or an enum member) as one of ``every_name()``, in its canonical spelling."""
    value = _enum_value(value)
    return value if value in common else check_choice(key, value, every_name(), where=WHERE)


@dataclass
class TrainingArguments(ProcessAttributes, ArgumentSetters):
    """The Trainer's arguments: transformers 5.x field names, defaults and meanings (see docs/trainer.md)."""

    default_optim: ClassVar[str] = "adamw_torch_fused"
    """The ``optim`` transformers uses by default (a class constant, as in transformers)."""

    # --- output ---
    output_dir: str | None = field(default=None, metadata={"help": "Where checkpoints, logs and the final model go (default 'trainer_output')."})

    # --- duration and batch size ---
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training batch size per process."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Evaluation batch size per process."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (fractions allowed)."})
    max_steps: int = field(default=-1, metadata={"help": "If > 0: total optimizer steps, overriding num_train_epochs. Required for datasets without len()."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step; the loss is normalised over the whole window."})
    average_tokens_across_devices: bool = field(default=True, metadata={"help": "Normalise the loss by the item count of all processes (False: each process by its own, then the processes' losses are averaged)."})
    auto_find_batch_size: bool = field(default=False, metadata={"help": "On an out-of-memory error, halve the training batch size and start training again."})

    # --- optimizer and schedule ---
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "Decoupled weight decay, not applied to biases and normalisation weights."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "Adam beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "Adam epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Clip the global gradient norm to this value; 0 disables clipping (and its cost)."})
    optim: str = field(default="adamw_torch_fused", metadata={"help": "Any name of transformers' OptimizerNames, resolved as the installed transformers does (docs/trainer.md)."})
    optim_args: str | None = field(default=None, metadata={"help": "Optimizer settings as 'key=value,key=value': the keys the chosen optim reads in transformers."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "A transformers scheduler name (linear, cosine, constant, ...)."})
    lr_scheduler_kwargs: dict | str | None = field(default=None, metadata={"help": "Extra scheduler arguments (dict or JSON string)."})
    warmup_steps: float = field(default=0, metadata={"help": "Warm-up steps: an integer, or a float in [0, 1) as a ratio of total steps."})
    warmup_ratio: float | None = field(default=None, metadata={"help": "transformers 5.1's name: read as warmup_steps=<ratio> (a ratio of total steps in [0, 1))."})
    optim_target_modules: None | str | list[str] = field(default=None, metadata={"help": "Modules the GaLore/APOLLO optimizers target (names or regexes, or 'all-linear')."})
    label_smoothing_factor: float = field(default=0.0, metadata={"help": "Label smoothing epsilon applied to the model's logits (0 = none)."})

    # --- precision, memory, compilation ---
    bf16: bool = field(default=False, metadata={"help": "bfloat16 mixed precision."})
    fp16: bool = field(default=False, metadata={"help": "float16 mixed precision with a gradient scaler."})
    bf16_full_eval: bool = field(default=False, metadata={"help": "Evaluate outside training with the model cast to bfloat16."})
    fp16_full_eval: bool = field(default=False, metadata={"help": "Evaluate outside training with the model cast to float16."})
    tf32: bool | None = field(default=None, metadata={"help": "TF32 matmuls on Ampere or newer NVIDIA GPUs (True needs one; False turns TF32 off)."})
    activation_checkpointing: bool | None = field(default=None, metadata={"help": "Recompute activations in backward to save memory (transformers 5.23's name for gradient_checkpointing; accepted with any transformers).", "nargs": "?", "const": True})
    activation_checkpointing_kwargs: dict | str | None = field(default=None, metadata={"help": "Arguments for activation checkpointing (every_n_layers, offload, or torch.utils.checkpoint keywords)."})
    gradient_checkpointing: bool | None = field(default=None, metadata={"help": "Recompute activations in backward to save memory (the older name of activation_checkpointing; None = not set, resolved to False).", "nargs": "?", "const": True})
    gradient_checkpointing_kwargs: dict | str | None = field(default=None, metadata={"help": "Arguments for gradient_checkpointing_enable()."})
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    torch_compile_backend: str | None = field(default=None, metadata={"help": "torch.compile backend; setting it enables torch_compile."})
    torch_compile_mode: str | None = field(default=None, metadata={"help": "torch.compile mode; setting it enables torch_compile."})
    use_liger_kernel: bool = field(default=False, metadata={"help": "Patch the model with Liger kernels (needs the liger-kernel package and a GPU)."})
    liger_kernel_config: dict | None = field(default=None, metadata={"help": "Keyword arguments for the Liger patching (with use_liger_kernel)."})
    use_cache: bool = field(default=False, metadata={"help": "Value of model.config.use_cache while training (the key/value cache is rarely useful then)."})
    neftune_noise_alpha: float | None = field(default=None, metadata={"help": "NEFTune: add uniform noise of this scale to the input embeddings while training."})
    torch_empty_cache_steps: int | None = field(default=None, metadata={"help": "Empty the accelerator's memory cache every N optimizer steps."})

    # --- logging ---
    logging_strategy: str = field(default="steps", metadata={"help": "no | steps | epoch."})
    logging_steps: float = field(default=500, metadata={"help": "Log every N optimizer steps (a float < 1 is a ratio of total steps)."})
    logging_first_step: bool = field(default=False, metadata={"help": "Also log after the first optimizer step."})
    log_on_each_node: bool = field(default=True, metadata={"help": "With several machines: the first process of each machine logs (False: only the global first)."})
    logging_nan_inf_filter: bool = field(default=True, metadata={"help": "Leave NaN/inf step losses out of the logged average."})
    logging_dir: str | None = field(default=None, metadata={"help": "transformers 5.1's name for the TensorBoard folder: the TensorBoard event files go there (default: output_dir/<run name>)."})
    include_num_input_tokens_seen: str | bool = field(default="no", metadata={"help": "Count input tokens: all | non_padding | no (True = all)."})
    log_level: str = field(default="passive", metadata={"help": "Logging level of the main process (passive leaves it alone)."})
    log_level_replica: str = field(default="warning", metadata={"help": "Logging level of the other processes."})
    disable_tqdm: bool | None = field(default=None, metadata={"help": "Hide the progress bar (default: hidden when logging is quieter than WARNING)."})
    report_to: None | str | list[str] = field(default="none", metadata={"help": "Trackers: none | all | jsonl | tensorboard | wandb | mlflow ('jsonl': trainkit's metrics.jsonl, written only when named)."})
    run_name: str | None = field(default=None, metadata={"help": "Run name shown by trackers (default: output_dir)."})
    project: str = field(default="huggingface", metadata={"help": "Project name used by the Trackio tracker only (trainkit does not drive Trackio)."})
    trackio_space_id: str | None = field(default=None, metadata={"help": "Trackio Space id (needs the Trackio tracker, absent from trainkit)."})
    trackio_bucket_id: str | None = field(default=None, metadata={"help": "Trackio Bucket id (needs the Trackio tracker, absent from trainkit)."})
    trackio_static_space_id: str | None = field(default=None, metadata={"help": "Trackio static Space id (needs the Trackio tracker, absent from trainkit); False is accepted."})

    # --- evaluation ---
    eval_strategy: str = field(default="no", metadata={"help": "no | steps | epoch."})
    eval_steps: float | None = field(default=None, metadata={"help": "Evaluate every N steps under eval_strategy='steps' (default: logging_steps)."})
    eval_delay: float = field(default=0, metadata={"help": "Epochs or steps to wait before the first evaluation."})
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate once before training as a sanity check."})
    eval_accumulation_steps: int | None = field(default=None, metadata={"help": "Move gathered predictions to CPU every N evaluation steps (bounds device memory)."})
    prediction_loss_only: bool = field(default=False, metadata={"help": "Evaluate and predict return only the loss."})
    include_for_metrics: list[str] = field(default_factory=list, metadata={"help": "Also pass 'inputs' and/or 'loss' to compute_metrics."})
    eval_do_concat_batches: bool = field(default=True, metadata={"help": "Concatenate evaluation batches; False keeps a list with one entry per batch."})
    eval_use_gather_object: bool = field(default=False, metadata={"help": "Gather non-tensor predictions across processes as Python objects."})
    batch_eval_metrics: bool = field(default=False, metadata={"help": "Call compute_metrics after every batch (compute_result=False) and once at the end (True)."})

    # --- checkpoints and the best model ---
    save_strategy: str = field(default="steps", metadata={"help": "no | steps | epoch | best."})
    save_steps: float = field(default=500, metadata={"help": "Save every N steps under save_strategy='steps' (a float < 1 is a ratio)."})
    save_total_limit: int | None = field(default=None, metadata={"help": "Keep at most N checkpoints; the best one is never deleted."})
    save_only_model: bool = field(default=False, metadata={"help": "Save weights only (no optimizer, scheduler or RNG state: cannot resume)."})
    save_on_each_node: bool = field(default=False, metadata={"help": "With several machines: each machine writes its own checkpoints."})
    async_save: bool = field(default=False, metadata={"help": "trainkit: checkpoints are copied to host memory and written, checksummed and committed by a background thread while training goes on (docs/checkpoints.md)."})
    async_save_when_busy: str = field(default="wait", metadata={"help": "trainkit, with async_save: a save that finds the previous one still being written waits for it ('wait': no checkpoint is lost) or is skipped with a warning ('skip': training first)."})
    checkpoint_dir: str | None = field(default=None, metadata={"help": "trainkit: where the checkpoint-N folders go (default: output_dir): a folder, or an object-store URL such as s3://bucket/run, gs://..., az://... (written through fsspec, committed by a manifest); resume_from_checkpoint=True and save_total_limit look there (docs/checkpoints.md)."})
    load_best_model_at_end: bool = field(default=False, metadata={"help": "Load the best checkpoint when training ends (needs matching eval and save strategies)."})
    metric_for_best_model: str | None = field(default=None, metadata={"help": "Metric that decides the best checkpoint (default 'loss' when needed)."})
    greater_is_better: bool | None = field(default=None, metadata={"help": "Whether a larger metric is better (default: unless the name ends in 'loss')."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "For scripts: a checkpoint folder to resume from (pass it to train())."})
    ignore_data_skip: bool = field(default=False, metadata={"help": "On resume, start the epoch's data from the beginning instead of skipping what was seen."})
    restore_callback_states_from_checkpoint: bool = field(default=False, metadata={"help": "On resume, restore the saved state of stateful callbacks (e.g. early stopping's counter)."})
    enable_jit_checkpoint: bool | None = field(default=None, metadata={"help": "On SIGTERM/SIGINT/SIGUSR1 all processes stop at one step, save checkpoint-N and exit 75; the same command resumes (docs/preemption.md). Default: on whenever checkpoints are saved (save_strategy != 'no'); False turns it off.", "nargs": "?", "const": True})

    # --- reproducibility and hardware ---
    seed: int = field(default=42, metadata={"help": "Seed set before the model is initialised and training starts."})
    full_determinism: bool = field(default=False, metadata={"help": "Seed and force deterministic algorithms (slower; for debugging)."})
    data_seed: int | None = field(default=None, metadata={"help": "Seed of the data shuffling (default: seed)."})
    use_cpu: bool = field(default=False, metadata={"help": "Run on CPU even when an accelerator is present."})
    local_rank: int = field(default=-1, metadata={"help": "Accepted for old launchers; the rank comes from the environment."})
    accelerator_config: dict | str | None = field(default=None, metadata={"help": "Engine data options (split_batches, even_batches, use_seedable_sampler, non_blocking, gradient_accumulation_kwargs, ...): a dict, a JSON file or an AcceleratorConfig; held as trainkit's AcceleratorConfig (transformers' fields)."})
    parallelism_config: Any = field(default=None, metadata={"help": "A ParallelismConfig (trainkit's or Accelerate's): data replicas x FSDP shards x tensor parallelism (docs/parallelism.md)."})
    ddp_find_unused_parameters: bool | None = field(default=None, metadata={"help": "DistributedDataParallel's find_unused_parameters."})
    ddp_bucket_cap_mb: int | None = field(default=None, metadata={"help": "DistributedDataParallel's bucket_cap_mb."})
    ddp_broadcast_buffers: bool | None = field(default=None, metadata={"help": "DistributedDataParallel's broadcast_buffers."})
    ddp_static_graph: bool | None = field(default=None, metadata={"help": "DistributedDataParallel's static_graph."})
    ddp_backend: str | None = field(default=None, metadata={"help": "Process-group backend: gloo or nccl (others where this torch build has them)."})
    ddp_timeout: int = field(default=1800, metadata={"help": "Timeout of the process group's collectives, in seconds."})
    debug: str | list[str] = field(default="", metadata={"help": "Debug features: underflow_overflow (tpu_metrics_debug needs a TPU)."})
    skip_memory_metrics: bool = field(default=True, metadata={"help": "False: add memory-use deltas to the train/eval metrics."})

    # --- data loading ---
    dataloader_drop_last: bool = field(default=False, metadata={"help": "Drop the last incomplete training batch."})
    dataloader_num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes (0 = load in the main process)."})
    dataloader_pin_memory: bool = field(default=True, metadata={"help": "Pin host memory of batches (only where a GPU is used)."})
    dataloader_persistent_workers: bool = field(default=False, metadata={"help": "Keep DataLoader workers alive between epochs."})
    dataloader_prefetch_factor: int | None = field(default=None, metadata={"help": "Batches each worker loads ahead."})
    dataloader_multiprocessing_context: str | None = field(default=None, metadata={"help": "Start method of DataLoader workers: fork | spawn | forkserver."})
    dataloader_in_order: bool = field(default=True, metadata={"help": "Yield worker batches in order (False: as soon as ready)."})
    remove_unused_columns: bool = field(default=True, metadata={"help": "Drop dataset columns that the model's forward does not take."})
    label_names: list[str] | None = field(default=None, metadata={"help": "Input keys holding the labels (default: the model's, else 'labels')."})
    train_sampling_strategy: str = field(default="random", metadata={"help": "random | sequential | group_by_length (batch_rebalance is transformers-only)."})
    group_by_length: bool = field(default=False, metadata={"help": "transformers 5.1's name: True is train_sampling_strategy='group_by_length'."})
    length_column_name: str = field(default="length", metadata={"help": "Column of precomputed lengths for group_by_length."})

    # --- FSDP ---
    fsdp: str | None = field(default=None, metadata={"help": "Enable FSDP: True, or words such as 'full_shard auto_wrap offload' (string or list).", "nargs": "?", "const": True})
    deepspeed: dict | str | None = field(default=None, metadata={"help": "A DeepSpeed JSON config (path or dict, \"auto\" values filled from these arguments), run on FSDP2/DDP (docs/deepspeed.md)."})
    fsdp_config: dict | str | None = field(default=None, metadata={"help": "FSDP options: a dict, a YAML/JSON file, or a whole `trainkit config` file; keys with or without 'fsdp_'."})

    # --- Hub ---
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the model to the Hugging Face Hub on save (checked for network at Trainer creation)."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository (default: the output_dir name)."})
    hub_strategy: str = field(default="every_save", metadata={"help": "end | every_save | checkpoint | all_checkpoints."})
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the one stored by `hf auth login`)."})
    hub_private_repo: bool | None = field(default=None, metadata={"help": "Create the Hub repository as private."})
    hub_always_push: bool = field(default=False, metadata={"help": "Push even if the previous push is unfinished (trainkit's pushes are synchronous, so every push happens)."})
    hub_revision: str | None = field(default=None, metadata={"help": "Branch or revision to push to."})

    # --- for scripts only (the Trainer does not read them) ---
    do_train: bool = field(default=False, metadata={"help": "For scripts: whether to train."})
    do_eval: bool = field(default=False, metadata={"help": "For scripts: whether to evaluate (set when eval_strategy is not 'no')."})
    do_predict: bool = field(default=False, metadata={"help": "For scripts: whether to predict."})

    def __post_init__(self) -> None:
        reset_ignored_field(self)  # the field proofs' test mode (TRAINKIT_IGNORE_FIELD); nothing when unset
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        self.output_dir = os.path.expanduser(str(self.output_dir))
        check_transformers_fields(self)  # the fields beyond the core ones: validated and normalised in one place
        check_version_dependent_fields(self)  # values whose meaning needs a newer transformers than the installed one
        for name in ("lr_scheduler_kwargs", "gradient_checkpointing_kwargs", "fsdp_config"):
            value = getattr(self, name)
            if isinstance(value, str) and value.lstrip().startswith("{"):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as error:
                    raise ConfigError(f"{name!r} in {WHERE} looks like JSON but does not parse: {error}.") from None
        self._normalise_choices()
        self._normalise_steps()
        self._check_sizes()
        self._check_best_model()
        self._check_precision_and_misc()
        self._fsdp_options = self._resolve_fsdp()

    # ---------------------------------------------------------------- validation helpers

    def _normalise_choices(self) -> None:
        self.eval_strategy = check_choice("eval_strategy", _enum_value(self.eval_strategy), INTERVAL_STRATEGIES, where=WHERE)
        self.logging_strategy = check_choice("logging_strategy", _enum_value(self.logging_strategy), INTERVAL_STRATEGIES, where=WHERE)
        self.save_strategy = check_choice("save_strategy", _enum_value(self.save_strategy), SAVE_STRATEGIES, where=WHERE)
        self.hub_strategy = check_choice("hub_strategy", _enum_value(self.hub_strategy), HUB_STRATEGIES, where=WHERE)
        # the everyday names are known without importing transformers; any other is checked against its list
        self.lr_scheduler_type = _named_choice("lr_scheduler_type", self.lr_scheduler_type, schedules.BUILT_HERE,
                                               schedules.scheduler_names)
        self.optim = _named_choice("optim", self.optim, BUILT_WITH_TORCH, optimizer_names)
        self.log_level = check_choice("log_level", self.log_level, LOG_LEVELS, where=WHERE)
        self.log_level_replica = check_choice("log_level_replica", self.log_level_replica, LOG_LEVELS, where=WHERE)
        if isinstance(self.include_num_input_tokens_seen, bool):
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"
        self.include_num_input_tokens_seen = check_choice(
            "include_num_input_tokens_seen", self.include_num_input_tokens_seen, TOKEN_COUNT_MODES, where=WHERE
        )
        self.report_to = _normalise_report_to(self.report_to)
        for item in self.include_for_metrics:
            check_choice("include_for_metrics", item, ("inputs", "loss"), where=WHERE)
        if isinstance(self.label_names, str):
            self.label_names = [self.label_names]
        # transformers 5 renamed gradient_checkpointing to activation_checkpointing; both spellings mean one thing here.
        self.gradient_checkpointing = bool(self.gradient_checkpointing)
        if self.torch_compile_backend is not None or self.torch_compile_mode is not None:
            self.torch_compile = True
        if self.torch_compile and self.torch_compile_backend is None:
            self.torch_compile_backend = "inductor"  # as transformers records it
        if self.eval_strategy != "no":
            self.do_eval = True
        if self.disable_tqdm is None:
            self.disable_tqdm = logging.getLogger().getEffectiveLevel() > logging.WARNING

    def _normalise_steps(self) -> None:
        if self.eval_strategy == "steps" and not self.eval_steps:
            if self.logging_steps > 0:
                self.eval_steps = self.logging_steps
            else:
                raise ConfigError(f"eval_strategy='steps' in {WHERE} needs eval_steps > 0 (or logging_steps > 0 to copy).")
        for kind, strategy in (("logging", self.logging_strategy), ("eval", self.eval_strategy), ("save", self.save_strategy)):
            name = f"{kind}_steps"
            value = getattr(self, name)
            if strategy != "steps":
                continue
            if value is None or value <= 0:
                raise ConfigError(f"{kind}_strategy='steps' in {WHERE} needs {name} > 0, got {value!r}.")
            if value >= 1:
                if value != int(value):
                    raise ConfigError(f"{name}={value!r} in {WHERE}: a value >= 1 counts steps and must be a whole number.")
                setattr(self, name, int(value))
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps={self.warmup_steps!r} in {WHERE} must be >= 0.")
        if self.warmup_steps >= 1:
            if self.warmup_steps != int(self.warmup_steps):
                raise ConfigError(f"warmup_steps={self.warmup_steps!r} in {WHERE}: a value >= 1 counts steps and must be a whole number.")
            self.warmup_steps = int(self.warmup_steps)

    def _check_sizes(self) -> None:
        positive = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} in {WHERE} must be an integer >= 1.")
        if self.eval_accumulation_steps is not None and self.eval_accumulation_steps < 1:
            raise ConfigError(f"eval_accumulation_steps={self.eval_accumulation_steps!r} in {WHERE} must be >= 1 or None.")
        if self.max_steps != int(self.max_steps):
            raise ConfigError(f"max_steps={self.max_steps!r} in {WHERE} must be an integer.")
        self.max_steps = int(self.max_steps)
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ConfigError(f"{WHERE}: set num_train_epochs > 0 or max_steps > 0; both allow no training step.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ConfigError(f"save_total_limit={self.save_total_limit!r} in {WHERE} must be >= 1 or None.")
        if self.dataloader_num_workers < 0:
            raise ConfigError(f"dataloader_num_workers={self.dataloader_num_workers!r} in {WHERE} must be >= 0.")
        if self.dataloader_num_workers == 0:
            if self.dataloader_prefetch_factor is not None:
                raise ConfigError(f"dataloader_prefetch_factor in {WHERE} needs dataloader_num_workers > 0 (it counts batches per worker).")
            if self.dataloader_persistent_workers:
                raise ConfigError(f"dataloader_persistent_workers=True in {WHERE} needs dataloader_num_workers > 0.")

    def _check_best_model(self) -> None:
        needs_metric = self.load_best_model_at_end or self.lr_scheduler_type in ("reduce_lr_on_plateau", "greedy")
        if needs_metric and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if (self.save_strategy == "best" or self.lr_scheduler_type in ("reduce_lr_on_plateau", "greedy")) and self.eval_strategy == "no":
            reason = "save_strategy='best'" if self.save_strategy == "best" else f"lr_scheduler_type={self.lr_scheduler_type!r}"
            raise ConfigError(f"{reason} in {WHERE} needs evaluations: set eval_strategy to 'steps' or 'epoch'.")
        if self.save_strategy == "best" and self.metric_for_best_model is None:
            # transformers' wording kept in the message ("`args.metric_for_best_model` must be provided"): scripts match it
            raise ConfigError(f"save_strategy='best' in {WHERE} keeps the checkpoints that improve a metric: "
                              "`args.metric_for_best_model` must be provided (e.g. 'loss' or a compute_metrics key).")
        if not self.load_best_model_at_end or self.save_strategy == "best":
            return
        if self.eval_strategy == "no" or self.save_strategy == "no":
            raise ConfigError(
                f"load_best_model_at_end=True in {WHERE} needs both evaluations and checkpoints, but "
                f"eval_strategy={self.eval_strategy!r} and save_strategy={self.save_strategy!r}."
            )
        if self.eval_strategy != self.save_strategy:
            raise ConfigError(
                f"load_best_model_at_end=True in {WHERE} needs eval_strategy and save_strategy to match (or "
                f"save_strategy='best'), but eval_strategy={self.eval_strategy!r} and save_strategy={self.save_strategy!r}."
            )
        eval_steps = self.eval_steps
        if self.eval_strategy == "steps" and eval_steps is not None:  # _normalise_steps set it (or refused) for 'steps'
            ratio = (eval_steps < 1, self.save_steps < 1)
            if ratio[0] != ratio[1] or round(self.save_steps * 1_000_000) % round(eval_steps * 1_000_000) != 0:
                raise ConfigError(
                    f"load_best_model_at_end=True in {WHERE} needs save_steps ({self.save_steps}) to be a multiple of "
                    f"eval_steps ({self.eval_steps}), so that every checkpoint has an evaluation."
                )

    def _check_precision_and_misc(self) -> None:
        if self.fp16 and self.bf16:
            raise ConfigError(f"{WHERE}: fp16=True and bf16=True contradict each other; choose one.")
        if self.use_cpu:
            self.dataloader_pin_memory = False
        if self.push_to_hub and not (self.hub_model_id or self.output_dir):
            raise ConfigError(f"push_to_hub=True in {WHERE} needs hub_model_id.")
        check_optimizer_name(self)  # its package and hardware are here, its optim_args keys read

    def _resolve_fsdp(self):
        words, sharding_named = _fsdp_words(self.fsdp)
        self.fsdp = words
        if not words:
            if self.fsdp_config:
                logger.warning("fsdp_config is set but fsdp is not: FSDP stays off (set fsdp='full_shard' or fsdp=True).")
            return None
        from trainkit.config.fsdp import FSDPOptions

        options = _load_fsdp_config(self.fsdp_config)
        overrides: dict[str, Any] = {}
        # fsdp=True (or 'offload' alone) turns FSDP on and leaves the strategy to fsdp_config.
        sharding = [FSDP_SHARDING_WORDS[w] for w in words if w in FSDP_SHARDING_WORDS] if sharding_named else []
        if len(sharding) > 1:
            raise ConfigError(f"fsdp={' '.join(words)!r} in {WHERE} names {len(sharding)} sharding strategies; name one.")
        if sharding:
            overrides["sharding_strategy"] = sharding[0]
        if "offload" in words:
            overrides["offload_params"] = True
        if "auto_wrap" in words and options.auto_wrap_policy is None:
            overrides["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
        if overrides and options is self.fsdp_config:
            options = dataclasses.replace(options, **overrides)  # the caller's own FSDPOptions stays as it was
        else:  # values from the words are canonical already: set on the options just read, no second build
            for option, value in overrides.items():
                setattr(options, option, value)
        if not isinstance(options, FSDPOptions):  # pragma: no cover - the loader's contract
            raise ConfigError(f"fsdp_config in {WHERE} did not resolve to FSDP options.")
        if options.cpu_ram_efficient_loading:
            from trainkit.engine import load_on_rank0_only

            load_on_rank0_only()  # arguments come before from_pretrained in a Trainer script
        return options

    # ---------------------------------------------------------------- derived values

    @property
    def fsdp_options(self):
        """The resolved :class:`trainkit.config.fsdp.FSDPOptions`, or None when FSDP is off."""
        return self._fsdp_options

    @property
    def place_model_on_device(self) -> bool:
        """Whether the Trainer puts the model on the device itself: always (the engine places it in ``prepare``)."""
        return True

    @property
    def mixed_precision(self) -> str:
        """The engine's name for the precision: 'no', 'bf16' or 'fp16'."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "no"

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warm-up steps for a run of ``total_steps`` optimizer steps (a ratio below 1 is resolved here)."""
        if 0 < self.warmup_steps < 1:
            return int(-(-self.warmup_steps * total_steps // 1))  # ceil without importing math for one call
        return int(self.warmup_steps)

    def main_process_first(self, local: bool = True, desc: str = "work"):
        """A context in which the main process (of each machine when ``local``) runs first, e.g. to build a
        dataset cache the others then read; as in transformers."""
        from trainkit.engine import process_state

        state = process_state(cpu=self.use_cpu or None)  # False = not set: the launcher may say --cpu
        logger.debug("%s: main process first (%s)", desc, "per machine" if local else "global")
        return state.local_main_process_first() if local else state.main_process_first()

    def to_dict(self) -> dict[str, Any]:
        """The arguments as a JSON-serialisable dict (tokens masked)."""
        result = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_token"):  # masked even when unset, as transformers does
                value = f"<{f.name.upper()}>"
            result[f.name] = _json_ready(value)
        return result

    def to_json_string(self) -> str:
        """The arguments as indented JSON (tokens masked)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)


def _json_ready(value: Any) -> Any:
    """A torch dtype (a subclass may declare a ``dtype`` field) as its name, ``torch.bfloat16`` -> ``"bfloat16"``,
    also inside dict values, and a configuration dataclass (``accelerator_config``) as its dict, as transformers
    writes them; everything else unchanged."""
    if type(value).__name__ == "dtype" and str(value).startswith("torch."):
        return str(value).split(".", 1)[1]
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "to_dict"):
        return _json_ready(value.to_dict())
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    return value


def _enum_value(value: Any) -> Any:
    """Accept transformers' enum members (IntervalStrategy.EPOCH, ...) as well as their string values."""
    return getattr(value, "value", value)


def _normalise_report_to(value: Any) -> list[str]:
    if value is None:
        return []
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    items = [str(i).strip().lower() for i in items if str(i).strip()]
    if items in (["none"], []):
        return []
    if items == ["all"]:
        return ["all"]
    # The engine's one list; "all" means every installed one ("jsonl" only when named, as transformers writes no such
    # file), "none" none.
    return [check_choice("report_to", item, (*tracker_names(), "all", "none"), where=WHERE) for item in items]


def _fsdp_words(value: Any) -> tuple[list[str], bool]:
    """Parse ``fsdp`` (bool, 'full_shard auto_wrap offload', or a list of such words) into (words, strategy named?)."""
    if value is None or value is False:
        return [], False
    if value is True:
        return ["full_shard"], False
    if isinstance(value, str):
        if value.strip().lower() in ("", "false", "no", "none", "0"):
            return [], False
        if value.strip().lower() in ("true", "yes", "1"):
            return ["full_shard"], False
        raw_words = value.replace(",", " ").split()
    else:
        raw_words = [str(_enum_value(v)) for v in value]
    valid = list(FSDP_SHARDING_WORDS) + list(FSDP_FLAG_WORDS)
    words = [check_choice("fsdp", w.strip().lower(), valid, where=WHERE) for w in raw_words]
    named = any(w in FSDP_SHARDING_WORDS for w in words)
    if not named:
        words.insert(0, "full_shard")  # 'offload' or 'auto_wrap' alone: sharding is implied, as in transformers
    return words, named


def _load_fsdp_config(value: Any):
    """fsdp_config (None, dict, YAML/JSON path, or a whole `trainkit config` file) -> FSDPOptions."""
    from trainkit.config import load_fsdp_config

    return load_fsdp_config(value if value is not None else {})


def reject_unknown_keywords(cls: type) -> None:
    """Wrap ``cls.__init__`` (a TrainingArguments dataclass, after ``@dataclass`` made it) so an unknown keyword is
    named with a did-you-mean instead of a bare TypeError."""
    init = getattr(cls, "__init__")  # the dataclass-made one
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def checked_init(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            key = unknown[0]
            newer = unknown_field_hint(key)  # a field of a newer transformers than trainkit knows
            if key in RENAMED_ARGUMENTS:
                hint = f" It is called {RENAMED_ARGUMENTS[key]} in transformers 5 and trainkit."
            elif newer:
                hint = newer
            else:
                guess = did_you_mean(key, names)
                hint = f" Did you mean {guess!r}?" if guess else ""
            raise UnknownArgumentError(f"{cls.__name__} got an unknown argument {key!r}.{hint}")
        init(self, *args, **kwargs)

    setattr(cls, "__init__", checked_init)


reject_unknown_keywords(TrainingArguments)

__all__ = ["TrainingArguments", "UnknownArgumentError", "reject_unknown_keywords"]
