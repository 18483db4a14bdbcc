"""The configuration flags shared by `trainkit launch` and `trainkit config`, and their resolution.

Flags carry Accelerate's names. Every flag defaults to None so that only the flags a user typed become
the top layer of the resolution: defaults < default config file < --config_file < the cluster's
environment (torchrun's PET_* and MASTER_ADDR/MASTER_PORT, Kubeflow) < SLURM (under srun) < flags.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from trainkit.config import (
    DISTRIBUTED_TYPES,
    MIXED_PRECISIONS,
    RDZV_BACKENDS,
    FSDPOptions,
    LaunchConfig,
    default_config_path,
    read_mapping_file,
)
from trainkit.config.parallelism import LAUNCH_KEYS as PARALLELISM_LAUNCH_KEYS
from trainkit.config.parallelism import LAUNCH_PREFIX as PARALLELISM_PREFIX

from trainkit.config.fsdp import ALIASES as FSDP_ALIASES

from .slurm import slurm_layer
from .torchrun_env import torchrun_env_layers

FLAG_SOURCE = "flag"
# Accelerate's launcher flags with other spellings of an FSDP option (config.fsdp.ALIASES), and its
# --fsdp_version (accepted and reported as unused: trainkit runs FSDP2 only).
_EXTRA_FSDP_FLAGS = ("backward_prefetch_policy", "reshard_after_forward", "version")
# Flags that map straight onto a LaunchConfig key of the same name, with their argparse type and help.
_PLAIN_FLAGS: dict[str, tuple[Any, str]] = {
    "num_processes": (int, "Total processes over all machines (as in Accelerate)."),
    "num_machines": (str, "Number of machines (nodes), or MIN:MAX for an elastic job (c10d rendezvous; machines "
                     "may leave and join, the workers resume with the same global batch)."),
    "machine_rank": (int, "This machine's rank, 0 .. num_machines-1."),
    "main_process_ip": (str, "Address of machine 0 (multi-machine jobs)."),
    "main_process_port": (int, "Rendezvous port on machine 0 (default: a free port on one machine, 29500 on several)."),
    "rdzv_backend": (str, f"Rendezvous backend for several machines: {', '.join(RDZV_BACKENDS)}."),
    "rdzv_conf": (str, "Extra c10d rendezvous options, key=value,... (e.g. last_call_timeout=5)."),
    "max_restarts": (int, "Restart the whole worker group up to K times after a failure."),
    "monitor_interval": (float, "Seconds between checks of worker health."),
    "mixed_precision": (str, f"Mixed precision: {', '.join(MIXED_PRECISIONS)}."),
    "gradient_accumulation_steps": (int, "Default gradient accumulation steps for the script's Accelerator."),
    "num_cpu_threads_per_process": (int, "OMP_NUM_THREADS per worker (default: cores / processes per machine)."),
    "collective_timeout": (float, "Seconds before a collective that never completes fails the job (default 600)."),
    "preemption_signals": (str, "Signals forwarded to every worker, which then save a checkpoint and stop "
                           "(default SIGTERM,SIGINT,SIGUSR1; see docs/preemption.md)."),
    "preemption_grace_period": (int, "Seconds to wait for the workers to save and exit after a forwarded signal, "
                                "before SIGKILL (default 90)."),
    "gpu_ids": (str, "GPUs to use on this machine: 'all' or a comma-separated list."),
    "distributed_type": (str, f"One of {', '.join(DISTRIBUTED_TYPES)} (normally implied by the flags below)."),
}
# DeepSpeed flags (Accelerate's): they fill the launch config's ``deepspeed_config`` block and imply
# distributed_type DEEPSPEED, which trainkit runs on FSDP2/DDP (docs/deepspeed.md).
_DEEPSPEED_FLAGS = {
    "zero_stage": "ZeRO stage 0-3 (3 = FSDP2 FULL_SHARD, 2 = SHARD_GRAD_OP, 1 = sharded optimizer state).",
    "offload_optimizer_device": "none | cpu (with --offload_param_device cpu and stage 3).",
    "offload_param_device": "none | cpu (with --offload_optimizer_device cpu and stage 3).",
    "offload_optimizer_nvme_path": "Refused: FSDP2 offloads to CPU memory only.",
    "offload_param_nvme_path": "Refused: FSDP2 offloads to CPU memory only.",
    "gradient_clipping": "Clip gradients to this total norm before each optimizer step.",
    "zero3_init_flag": "true: build the model on the meta device, rank 0 loads the weights.",
    "zero3_save_16bit_model": "true: save full (gathered) weights instead of shards.",
    "deepspeed_config_file": "A DeepSpeed JSON config (\"auto\" values allowed).",
    "deepspeed_hostfile": "Refused: DeepSpeed's launcher; use --num_machines/--main_process_ip.",
    "deepspeed_multinode_launcher": "Only 'standard' (torchrun on each machine).",
    "deepspeed_inclusion_filter": "Refused: DeepSpeed's launcher.",
    "deepspeed_exclusion_filter": "Refused: DeepSpeed's launcher.",
    "deepspeed_moe_layer_cls_names": "Refused: DeepSpeed's MoE leaf modules.",
}
# torch.compile flags (Accelerate's): they fill the launch config's ``dynamo_config`` block.
_DYNAMO_FLAGS = {
    "dynamo_backend": "torch.compile backend for prepared models (inductor, aot_eager, ...; no = off).",
    "dynamo_mode": "torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs.",
    "dynamo_use_fullgraph": "true: fail on graph breaks instead of splitting the graph.",
    "dynamo_use_dynamic": "true: compile for dynamic shapes.",
    "dynamo_use_regional_compilation": "true: compile the repeated block once instead of the whole model.",
}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag that sets a config key (shared by `launch` and `config`)."""
    group = parser.add_argument_group("configuration (override the config file)")
    group.add_argument("--config_file", default=None, help=f"YAML or JSON config file (default: {default_config_path()}).")
    for name, (kind, text) in _PLAIN_FLAGS.items():
        group.add_argument(f"--{name}", type=kind, default=None, help=text)
    group.add_argument("--cpu", "--use_cpu", dest="use_cpu", action="store_const", const=True, default=None,
                       help="Run on CPU even where GPUs exist.")
    group.add_argument("--multi_gpu", action="store_const", const=True, default=None,
                       help="Accelerate's flag: distributed_type MULTI_GPU (CPU with gloo where no GPU exists).")
    group.add_argument("--debug", action="store_const", const=True, default=None,
                       help="Check that every rank calls the same collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL).")
    group.add_argument("--same_network", action="store_const", const=True, default=None, help=argparse.SUPPRESS)
    deepspeed = parser.add_argument_group("DeepSpeed configs, run on FSDP2 (each flag implies --use_deepspeed)")
    deepspeed.add_argument("--use_deepspeed", action="store_const", const=True, default=None,
                           help="distributed_type DEEPSPEED (ZeRO stages on FSDP2/DDP).")
    for name, text in _DEEPSPEED_FLAGS.items():
        deepspeed.add_argument(f"--{name}", type=str, default=None, metavar="VALUE", help=text)
    dynamo = parser.add_argument_group("torch.compile")
    for name, text in _DYNAMO_FLAGS.items():
        dynamo.add_argument(f"--{name}", type=str, default=None, metavar="VALUE", help=text)
    parallelism = parser.add_argument_group("ParallelismConfig (the launch config's parallelism_config: block)")
    parallelism.add_argument("--use_parallelism_config", action="store_const", const=True, default=None,
                             help="Accelerate's flag; accepted (the --parallelism_config_* sizes decide).")
    for name in PARALLELISM_LAUNCH_KEYS:
        parallelism.add_argument(f"--{PARALLELISM_PREFIX}{name}", type=str, default=None, metavar="VALUE",
                                 help=_PARALLELISM_DOCS[name])
    fsdp = parser.add_argument_group("FSDP (each --fsdp_* flag implies --use_fsdp)")
    fsdp.add_argument("--use_fsdp", action="store_const", const=True, default=None, help="distributed_type FSDP.")
    for name in FSDPOptions.field_names() + list(_EXTRA_FSDP_FLAGS):
        # A value is required, as in Accelerate (`--fsdp_offload_params true`): an optional one would swallow
        # the script path in `--fsdp_offload_params train.py`. Values stay text: the config layer validates them.
        fsdp.add_argument(f"--fsdp_{name}", type=str, default=None, metavar="VALUE",
                          help=_fsdp_help(name))


_PARALLELISM_DOCS = {
    "dp_replicate_size": "Full model copies; gradients all-reduced across them (-1: the rest of the processes).",
    "dp_shard_size": "Processes each copy is sharded across with FSDP2 (-1: the rest).",
    "tp_size": "Processes each layer is split across (tensor parallel, by the model's TP plan).",
    "cp_size": "Processes each sequence is split across, attention by torch's ring attention (CUDA only).",
    "sp_size": "Processes each sequence is split across, attention by Ulysses all-to-all over the heads.",
    "cp_backend": "torch (the only value).",
    "sp_backend": "deepspeed (the only value: the Ulysses algorithm, run on torch's collectives).",
    "cp_comm_strategy": "allgather (default) or alltoall: how the ring passes key/value shards (cp_size > 1).",
    "sp_seq_length": "The length every batch has, checked when --parallelism_config_sp_seq_length_is_variable false.",
    "sp_seq_length_is_variable": "true (default): any batch length, padded to a multiple of sp_size; false: fixed.",
    "sp_attn_implementation": "Attention run on the gathered sequence: sdpa (default), flash_attention_2/3.",
}


def _fsdp_help(name: str) -> str:
    if name in FSDPOptions.field_names():
        return FSDPOptions.help_of(name)
    if name in FSDP_ALIASES:
        return f"Accelerate's spelling of --fsdp_{FSDP_ALIASES[name]}" + (
            ": true = FULL_SHARD, false = SHARD_GRAD_OP." if name == "reshard_after_forward" else ".")
    return "Accepted from Accelerate's configs, without effect: trainkit runs FSDP2 only."


def flags_to_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the user set on the command line (None = not typed), as one layer."""
    mapping: dict[str, Any] = {}
    for name in _PLAIN_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            mapping[name] = value
    for name in ("use_cpu", "debug", "same_network"):
        if getattr(args, name, None):
            mapping[name] = True
    if getattr(args, "multi_gpu", None):
        mapping["distributed_type"] = "MULTI_GPU"
    deepspeed = {name: getattr(args, name) for name in _DEEPSPEED_FLAGS if getattr(args, name, None) is not None}
    if getattr(args, "use_deepspeed", None) or deepspeed:
        mapping["distributed_type"] = "DEEPSPEED"
    if deepspeed:
        mapping["deepspeed_config"] = deepspeed
    dynamo = {name: getattr(args, name) for name in _DYNAMO_FLAGS if getattr(args, name, None) is not None}
    if dynamo:
        mapping["dynamo_config"] = dynamo
    parallelism = {PARALLELISM_PREFIX + name: getattr(args, PARALLELISM_PREFIX + name) for name in PARALLELISM_LAUNCH_KEYS
                   if getattr(args, PARALLELISM_PREFIX + name, None) is not None}
    if parallelism:
        mapping["parallelism_config"] = parallelism
    fsdp_options = {}
    for name in FSDPOptions.field_names() + list(_EXTRA_FSDP_FLAGS):
        value = getattr(args, f"fsdp_{name}", None)
        if value is not None:
            fsdp_options[f"fsdp_{name}"] = value
    if getattr(args, "use_fsdp", None) or fsdp_options:
        mapping["distributed_type"] = "FSDP"
    if fsdp_options:
        mapping["fsdp_config"] = fsdp_options
    return mapping


def config_layers(args: argparse.Namespace, *, read_default_file: bool = True) -> list[tuple[dict[str, Any], str]]:
    """The resolution layers in precedence order (lowest first), each with its provenance label."""
    layers: list[tuple[dict[str, Any], str]] = []
    default_path = default_config_path()
    explicit = getattr(args, "config_file", None)
    if read_default_file and default_path.is_file() and (explicit is None or not _same_file(explicit, default_path)):
        layers.append((read_mapping_file(default_path), str(default_path)))
    if explicit is not None:
        layers.append((read_mapping_file(explicit), str(explicit)))
    layers.extend(torchrun_env_layers())
    slurm = slurm_layer()
    if slurm is not None:
        layers.append(slurm)
    layers.append((flags_to_mapping(args), FLAG_SOURCE))
    return layers


def resolve_config(args: argparse.Namespace, *, cuda_available: bool | None = None) -> LaunchConfig:
    """Resolve the launch config from files, SLURM and flags (raises ConfigError naming the bad key)."""
    return LaunchConfig.resolve(config_layers(args), cuda_available=cuda_available)


def _same_file(a: str, b: os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(os.path.expanduser(a), b)
    except OSError:
        return False


def describe_source(source: str, key: str) -> str:
    """Human wording of a provenance label: a flag is shown as the flag the user typed."""
    if source == FLAG_SOURCE:
        return "flag --num_machines MIN:MAX" if key == "min_machines" else f"flag --{key.split('.')[-1]}"
    return source
