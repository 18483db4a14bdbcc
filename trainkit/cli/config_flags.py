"""The configuration flags shared by `trainkit launch` and `trainkit config`, and their resolution.

Flags carry Accelerate's names and, where Accelerate's launcher has the flag, its parser default
(:data:`ACCELERATE_DEFAULTS`: ``--multi_gpu`` reads False when not typed); the others default to None. Only the
flags a user typed (``typed_flags``) become the top layer of the resolution: defaults < default config file <
--config_file < the cluster's environment (torchrun's PET_* and MASTER_ADDR/MASTER_PORT, Kubeflow) < SLURM (under
srun) < flags.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from trainkit.config import FSDPOptions, LaunchConfig, default_config_path, read_mapping_file
from trainkit.config.deepspeed import DEEPSPEED_YAML_OPTIONS
from trainkit.config.dynamo import DYNAMO_OPTIONS
from trainkit.config.engine_options import USE_CPU
from trainkit.config.options import declared_options, flag_options
from trainkit.config.precision import option_blocks
from trainkit.config.parallelism import LAUNCH_PREFIX as PARALLELISM_PREFIX
from trainkit.config.parallelism import PARALLELISM_OPTIONS

from trainkit.config.fsdp import ALIASES as FSDP_ALIASES

from .slurm import slurm_layer
from .torchrun_env import torchrun_env_layers
from .torchrun_flags import torchrun_layers
from .typed_flags import record_typed_flags, was_typed

FLAG_SOURCE = "flag"
# Accelerate's launcher flags with other spellings of an FSDP option (config.fsdp.ALIASES), and its
# --fsdp_version (accepted and reported as unused: trainkit runs FSDP2 only).
_EXTRA_FSDP_FLAGS = ("backward_prefetch_policy", "reshard_after_forward", "version")
# Flags that map straight onto a LaunchConfig key of the same name: every key whose declaration has a flag
# (config/launch.py; its argparse type and help come from the declaration).
_PLAIN_FLAGS = flag_options(LaunchConfig)
# DeepSpeed flags (Accelerate's): they fill the launch config's ``deepspeed_config`` block and imply
# distributed_type DEEPSPEED, which trainkit runs on FSDP2/DDP (docs/deepspeed.md).
_DEEPSPEED_FLAGS = {key: option.help for key, option in DEEPSPEED_YAML_OPTIONS.items() if option.flag}
# torch.compile flags (Accelerate's): they fill the launch config's ``dynamo_config`` block (declared in
# config/dynamo.py).
_DYNAMO_FLAGS = {key: option.help for key, option in DYNAMO_OPTIONS.items()}
_FSDP_DEFAULTS = {"activation_checkpointing": "false", "cpu_ram_efficient_loading": "true", "forward_prefetch": "false",
                  "min_num_params": 100_000_000, "offload_params": "false", "reshard_after_forward": "true",
                  "sharding_strategy": "FULL_SHARD", "sync_module_states": "true", "use_orig_params": "true",
                  "version": "1"}
_PARALLELISM_DEFAULTS = {"cp_backend": "torch", "cp_comm_strategy": "allgather", "cp_size": 1,
                         "dp_replicate_size": 1, "dp_shard_size": 1, "sp_attn_implementation": "sdpa",
                         "sp_backend": "deepspeed", "sp_seq_length_is_variable": True, "sp_size": 1, "tp_size": 1}
ACCELERATE_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(("use_cpu", "multi_gpu", "use_deepspeed", "use_fsdp", "same_network",
                     "use_parallelism_config", "dynamo_use_fullgraph", "dynamo_use_dynamic",
                     "dynamo_use_regional_compilation"), False),
    "dynamo_mode": "default", "max_restarts": 0, "monitor_interval": 0.1, "rdzv_backend": "static", "rdzv_conf": "",
    **{f"fsdp_{name}": value for name, value in _FSDP_DEFAULTS.items()},
    **{PARALLELISM_PREFIX + name: value for name, value in _PARALLELISM_DEFAULTS.items()},
}
"""What ``accelerate launch``'s parser reads for its flags when they are not typed (a test compares this with the
installed Accelerate's parser). Not typed, they never reach the resolution: the config file or trainkit's own
default decides."""


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag that sets a config key (shared by `launch` and `config`)."""
    first = len(parser._actions)
    group = parser.add_argument_group("configuration (override the config file)")
    group.add_argument("--config_file", default=None, help=f"YAML or JSON config file (default: {default_config_path()}).")
    for name, option in _PLAIN_FLAGS.items():
        group.add_argument(f"--{name}", type=option.flag_type, default=None, help=option.help)
    group.add_argument("--cpu", "--use_cpu", dest="use_cpu", action="store_const", const=True, default=None,
                       help=USE_CPU.help)
    group.add_argument("--multi_gpu", action="store_const", const=True, default=None,
                       help="Accelerate's flag: distributed_type MULTI_GPU (CPU with gloo where no GPU exists).")
    group.add_argument("--debug", action="store_const", const=True, default=None,
                       help=declared_options(LaunchConfig)["debug"].help)
    group.add_argument("--same_network", action="store_const", const=True, default=None, help=argparse.SUPPRESS)
    deepspeed = parser.add_argument_group("DeepSpeed configs, run on FSDP2 (each flag implies --use_deepspeed)")
    deepspeed.add_argument("--use_deepspeed", action="store_const", const=True, default=None,
                           help="distributed_type DEEPSPEED (ZeRO stages on FSDP2/DDP).")
    for name, text in _DEEPSPEED_FLAGS.items():
        deepspeed.add_argument(f"--{name}", type=str, default=None, metavar="VALUE", help=text)
    dynamo = parser.add_argument_group("torch.compile")
    for name, text in _DYNAMO_FLAGS.items():
        dynamo.add_argument(f"--{name}", type=str, default=None, metavar="VALUE", help=text)
    for block, (mode, declaration) in option_blocks().items():  # a mixed precision's own options
        precision_group = parser.add_argument_group(f"mixed precision {mode} ({block}: block)")
        for name, option in declared_options(declaration.options).items():
            precision_group.add_argument(f"--{declaration.flag_prefix}{name}", type=str, default=None, metavar="VALUE",
                               help=option.help)
    parallelism = parser.add_argument_group("ParallelismConfig (the launch config's parallelism_config: block)")
    parallelism.add_argument("--use_parallelism_config", action="store_const", const=True, default=None,
                             help="Accelerate's flag; accepted (the --parallelism_config_* sizes decide).")
    for name, option in PARALLELISM_OPTIONS.items():
        parallelism.add_argument(f"--{PARALLELISM_PREFIX}{name}", type=str, default=None, metavar="VALUE",
                                 help=option.help)
    fsdp = parser.add_argument_group("FSDP (each --fsdp_* flag implies --use_fsdp)")
    fsdp.add_argument("--use_fsdp", action="store_const", const=True, default=None, help="distributed_type FSDP.")
    for name in FSDPOptions.field_names() + list(_EXTRA_FSDP_FLAGS):
        # A value is required, as in Accelerate (`--fsdp_offload_params true`): an optional one would swallow
        # the script path in `--fsdp_offload_params train.py`. Values stay text: the config layer validates them.
        fsdp.add_argument(f"--fsdp_{name}", type=str, default=None, metavar="VALUE",
                          help=_fsdp_help(name))
    added = parser._actions[first:]
    for action in added:
        action.default = ACCELERATE_DEFAULTS.get(action.dest, action.default)
    record_typed_flags(parser, added)


def _fsdp_help(name: str) -> str:
    if name in FSDPOptions.field_names():
        return FSDPOptions.help_of(name)
    if name in FSDP_ALIASES:
        return f"Accelerate's spelling of --fsdp_{FSDP_ALIASES[name]}" + (
            ": true = FULL_SHARD, false = SHARD_GRAD_OP." if name == "reshard_after_forward" else ".")
    return "Accepted from Accelerate's configs, without effect: trainkit runs FSDP2 only."


def flags_to_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the user typed on the command line (``typed_flags``), as one layer."""
    def typed(name: str) -> bool:
        return was_typed(args, name, ACCELERATE_DEFAULTS.get(name))

    mapping: dict[str, Any] = {name: getattr(args, name) for name in _PLAIN_FLAGS if typed(name)}
    for name in ("use_cpu", "debug", "same_network"):
        if typed(name) and getattr(args, name):
            mapping[name] = True
    if typed("multi_gpu") and args.multi_gpu:
        mapping["distributed_type"] = "MULTI_GPU"
    deepspeed = {name: getattr(args, name) for name in _DEEPSPEED_FLAGS if typed(name)}
    if (typed("use_deepspeed") and args.use_deepspeed) or deepspeed:
        mapping["distributed_type"] = "DEEPSPEED"
    if deepspeed:
        mapping["deepspeed_config"] = deepspeed
    dynamo = {name: getattr(args, name) for name in _DYNAMO_FLAGS if typed(name)}
    if dynamo:
        mapping["dynamo_config"] = dynamo
    for block, (_, declaration) in option_blocks().items():
        given = {name: getattr(args, declaration.flag_prefix + name) for name in declared_options(declaration.options)
                 if typed(declaration.flag_prefix + name)}
        if given:
            mapping[block] = given
    parallelism = {PARALLELISM_PREFIX + name: getattr(args, PARALLELISM_PREFIX + name) for name in PARALLELISM_OPTIONS
                   if typed(PARALLELISM_PREFIX + name)}
    if parallelism:
        mapping["parallelism_config"] = parallelism
    fsdp_options = {}
    for name in FSDPOptions.field_names() + list(_EXTRA_FSDP_FLAGS):
        if typed(f"fsdp_{name}"):
            fsdp_options[f"fsdp_{name}"] = getattr(args, f"fsdp_{name}")
    if (typed("use_fsdp") and args.use_fsdp) or fsdp_options:
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
    layers.extend(torchrun_layers(args, layers))  # torchrun's spellings (--nnodes ...), one layer each, named
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
