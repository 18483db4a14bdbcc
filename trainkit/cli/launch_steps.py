"""The steps of ``trainkit launch`` before anything starts, under the names Accelerate's launcher gives them.

``_validate_launch_command(args)`` resolves the launch config from the layers (files, cluster environment,
typed flags) and writes the resolved settings back onto ``args``, so that code reading ``args`` after it (as
``accelerate launch``'s helpers do) sees the values the launch uses; ``prepare_simple_launcher_cmd_env(args)`` gives
the one-process launch's command and environment. ``trainkit launch`` runs exactly these (``launch_command.run``).
Several processes go through ``torch.distributed.run`` with :func:`launch_environment` (no second mechanism).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from trainkit.config import LAUNCH_CONFIG_ENV, LaunchConfig, write_launch_handoff

from .config_flags import ACCELERATE_DEFAULTS, resolve_config
from .typed_flags import was_typed
from .worker import LAUNCHER_PID_ENV

RESOLVED = "launch_config"
"""The attribute of ``args`` that holds the resolved :class:`LaunchConfig` after :func:`_validate_launch_command`."""
INTEL_OPENMP_CPU_SETTINGS = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"}
"""Intel OpenMP's thread placement for a one-process CPU launch (as ``accelerate launch --cpu`` sets it): threads
pinned to neighbouring cores, idle threads sleep after 1 ms. GNU OpenMP (pip's torch) ignores them. Not for several
processes on one machine: each would pin its threads to the same cores. A value already set is kept."""
_DISTRIBUTED_SWITCHES = {"multi_gpu": "MULTI_GPU", "use_fsdp": "FSDP", "use_deepspeed": "DEEPSPEED"}


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, LaunchConfig, bool]:
    """Resolve the launch config (ConfigError naming a bad key or value) and write its settings onto ``args`` for
    the flags not typed.

    Returns ``(args, config, mixed_precision_from_a_file)``; ``args.launch_config`` holds ``config`` too.
    """
    config = resolve_config(args)
    settings = {name: getattr(config, name) for name in LaunchConfig.field_names()
                if not isinstance(getattr(config, name), (dict, list))}
    settings.update({switch: config.distributed_type == kind for switch, kind in _DISTRIBUTED_SWITCHES.items()})
    if config.fsdp_config is not None:
        settings.update({f"fsdp_{name}": getattr(config.fsdp_config, name) for name in config.fsdp_config.field_names()})
    for name, value in settings.items():
        # A typed flag keeps what was typed (``--num_machines 1:2`` stays the range; resolving again gives the same).
        if hasattr(args, name) and not was_typed(args, name, ACCELERATE_DEFAULTS.get(name)):
            setattr(args, name, value)
    setattr(args, RESOLVED, config)
    source = config.source_of("mixed_precision")
    return args, config, source not in ("default", "flag") and not source.startswith("flag ")


def launch_environment(config: LaunchConfig) -> dict[str, str]:
    """The variables every worker of this launch gets: the hand-off file (written now) and :func:`worker_environment`."""
    return worker_environment(config, write_launch_handoff(config, _handoff_path(config)))


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The one-process launch: ``python script args...`` (or ``python -m module``) and its whole environment.

    ``args`` as :func:`_validate_launch_command` left it (it is run first when it was not).
    """
    config = getattr(args, RESOLVED, None) or _validate_launch_command(args)[1]
    command = [sys.executable] + (["-m"] if getattr(args, "module", False) else [])
    command += [args.training_script, *args.training_script_args]
    environment = {**os.environ, **launch_environment(config)}
    if config.use_cpu and config.num_processes == 1:
        for name, value in INTEL_OPENMP_CPU_SETTINGS.items():
            environment.setdefault(name, value)
    return command, environment


def _handoff_path(config: LaunchConfig) -> Path:
    """One small file per distinct config, reused by identical launches (nothing to clean up)."""
    payload = json.dumps([config.to_dict(full=True), config.provenance], sort_keys=True).encode()
    folder = Path(tempfile.gettempdir()) / f"trainkit-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"launch-{hashlib.sha256(payload).hexdigest()[:16]}.json"


def worker_environment(config: LaunchConfig, handoff: Path) -> dict[str, str]:
    """Variables every worker needs: the hand-off file, threads, debug checks, visible GPUs."""
    environment = {LAUNCH_CONFIG_ENV: str(handoff), LAUNCHER_PID_ENV: str(os.getpid())}
    threads = config.num_cpu_threads_per_process
    if threads is None and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // config.processes_per_machine)
    if threads is not None:
        environment["OMP_NUM_THREADS"] = str(threads)
    if config.debug:
        # gloo and nccl wrap every collective in a check that all ranks call the same one.
        environment["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if config.gpu_ids not in (None, "all"):
        environment["CUDA_VISIBLE_DEVICES"] = config.gpu_ids
    return environment

