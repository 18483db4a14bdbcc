"""The placement torchrun reads from its environment: Kubeflow's ``PET_*`` and ``MASTER_ADDR``/``MASTER_PORT``.

torchrun's parser takes each option's default from ``PET_<OPTION>`` (its ``env`` argparse action); Kubeflow
Trainer sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
``PET_MASTER_PORT`` in every node's container, and Kubeflow's elastic PyTorchJob ``PET_RDZV_*`` and
``PET_MAX_RESTARTS``. ``trainkit launch`` passes those options to torchrun itself, so it reads the same variables
here, as resolution layers above the config files and below the flags, each with its own provenance
(``env PET_NNODES``). ``MASTER_ADDR`` / ``MASTER_PORT`` (the names ``env://`` reads, and which cluster scripts
export) give the address and port where no ``PET_`` form does. ``WORLD_SIZE`` and ``RANK`` are not read: torch
counts processes with them, Kubeflow's PyTorchJob v1 counts pods, so either reading would be wrong somewhere.

Why above the config files: a file ``trainkit config`` writes always names ``num_machines: 1`` and
``machine_rank: 0``; were it to win, every pod of a TrainJob would train alone. A file value the environment
replaces is named in one line (:func:`override_notice`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainkit.config import LaunchConfig
from trainkit.config.options import env_options

ENV_PREFIX = "env "
_DECLARED = env_options(LaunchConfig)  # each launch key's variables are declared with it (config/launch.py)
PET_KEYS = {variable: key for variable, key in _DECLARED.items() if variable.startswith("PET_")}
"""PET_ variable -> the LaunchConfig key it sets (the torchrun options trainkit passes itself)."""
NPROC_VARIABLE = "PET_NPROC_PER_NODE"
"""Processes per machine: an integer, or torchrun's ``auto`` / ``cpu`` / ``gpu`` (Kubeflow's default is ``auto``)."""
ENDPOINT_VARIABLE = "PET_RDZV_ENDPOINT"
"""``host:port`` of the c10d rendezvous (Kubeflow's elastic PyTorchJob): address and port when PET_MASTER_* are absent."""
RDZV_ID_VARIABLE = "PET_RDZV_ID"
"""The run id every machine of a c10d rendezvous names; ``trainkit launch`` uses it when set."""
PLAIN_KEYS = {variable: key for variable, key in _DECLARED.items() if not variable.startswith("PET_")}
"""``MASTER_ADDR`` / ``MASTER_PORT``: the address and port where no ``PET_`` form gives them."""
# torchrun options trainkit decides from its own settings: a PET_ value for them cannot act (named in a notice).
DECIDED_BY_TRAINKIT = {
    "PET_SIGNALS_TO_HANDLE": "preemption_signals",
    "PET_SHUTDOWN_TIMEOUT": "preemption_grace_period",
    "PET_STANDALONE": "the loopback rendezvous of one machine",
    "PET_MODULE": "trainkit's worker entry point",
    "PET_NO_PYTHON": "trainkit's worker entry point",
    "PET_RUN_PATH": "trainkit's worker entry point",
}


def torchrun_env_layers(environ: Mapping[str, str] | None = None) -> list[tuple[dict[str, Any], str]]:
    """One ``(mapping, "env NAME")`` layer per variable set, in torchrun's meaning; empty outside such a job.

    ``PET_NPROC_PER_NODE`` becomes ``num_processes`` (the total, as in Accelerate): processes per machine times
    the machine count of ``PET_NNODES`` (its MAX for ``MIN:MAX``; 1 when unset, torchrun's default).
    """
    env = os.environ if environ is None else environ
    layers: list[tuple[dict[str, Any], str]] = []
    for variable, key in PLAIN_KEYS.items():  # lowest: a PET_ form of the same key wins over it
        if env.get(variable, "").strip():
            layers.append(({key: env[variable].strip()}, ENV_PREFIX + variable))
    endpoint = env.get(ENDPOINT_VARIABLE, "").strip()
    if endpoint:
        host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
        layers.append(({"main_process_ip": host, **({"main_process_port": port} if port else {})},
                       ENV_PREFIX + ENDPOINT_VARIABLE))
    for variable, key in PET_KEYS.items():
        if env.get(variable, "").strip():
            layers.append(({key: env[variable].strip()}, ENV_PREFIX + variable))
    nproc = env.get(NPROC_VARIABLE, "").strip()
    if nproc:
        machines = _max_machines(env.get("PET_NNODES", "").strip() or "1")
        per_machine = local_world_size(nproc)
        source = ENV_PREFIX + NPROC_VARIABLE + (" x PET_NNODES" if env.get("PET_NNODES", "").strip() else "")
        layers.append(({"num_processes": per_machine * machines if machines else per_machine}, source))
    return layers


def local_world_size(nproc_per_node: str) -> int:
    """Processes per machine for a ``PET_NPROC_PER_NODE`` value, as torchrun counts them (``auto``: one per
    accelerator, else one per CPU; ``cpu``; ``gpu``). Only a non-integer value imports torch."""
    try:
        return int(nproc_per_node)
    except ValueError:
        pass
    from torch.distributed.run import determine_local_world_size

    from trainkit.config import ConfigError

    try:
        return int(determine_local_world_size(nproc_per_node))
    except ValueError as error:
        raise ConfigError(f"Invalid value {nproc_per_node!r} for {NPROC_VARIABLE} (env): {error} "
                          "Expected an integer, auto, cpu or gpu.") from None


def _max_machines(nnodes: str) -> int | None:
    try:
        return int(nnodes.rpartition(":")[2])
    except ValueError:
        return None  # LaunchConfig reports the bad PET_NNODES value, naming it


def is_env_source(source: str) -> bool:
    """True for a value the environment gave (this module's layers and Slurm's), not one the user typed."""
    return source.startswith(ENV_PREFIX)


def override_notice(layers: Sequence[tuple[Mapping[str, Any], str]]) -> str | None:
    """One line naming config-file values the environment replaced, or None.

    ``layers``: the resolution layers, lowest first (as ``config_flags.config_layers`` builds them).
    """
    replaced: list[str] = []
    files: dict[str, tuple[Any, str]] = {}
    for mapping, source in layers:
        if is_env_source(source):
            for key, value in mapping.items():
                if key in files and str(files[key][0]) != str(value):
                    replaced.append(f"{key} {files[key][0]} from {files[key][1]} -> {value} ({source})")
        elif not source.startswith("flag"):  # the flags, under either spelling
            files.update({key: (value, source) for key, value in mapping.items()})
    if not replaced:
        return None
    return "trainkit: the cluster's environment replaces config-file values: " + "; ".join(replaced) + "."


def undecidable_notice(environ: Mapping[str, str] | None = None) -> str | None:
    """One line naming PET_ variables set for torchrun options that trainkit decides itself, or None."""
    env = os.environ if environ is None else environ
    named = [f"{variable} ({DECIDED_BY_TRAINKIT[variable]} decides it)" for variable in DECIDED_BY_TRAINKIT
             if env.get(variable, "").strip()]
    if not named:
        return None
    return "trainkit launch: these torchrun variables have no effect: " + "; ".join(named) + "."
