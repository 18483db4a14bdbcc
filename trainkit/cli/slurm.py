"""Reading a Slurm allocation: under `srun`, the machine count, this machine's rank and machine 0's address.

Used only when `trainkit launch` runs as a Slurm job step (one launcher task per node); flags still win.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from trainkit.config.slurm_hosts import first_slurm_host

SLURM_SOURCE = "env SLURM_*"


def first_hostname(nodelist: str) -> str | None:
    """The first host of a Slurm nodelist ("gpu[01-04,07],cpu3" -> "gpu01"), without calling scontrol.

    Falls back to ``scontrol show hostnames`` for forms the parser does not fully cover (it returns None then).
    """
    return first_slurm_host(nodelist) or _scontrol_first_host(nodelist)


def _scontrol_first_host(nodelist: str) -> str | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def slurm_layer(environ: dict[str, str] | None = None) -> tuple[dict[str, Any], str] | None:
    """Config keys implied by a Slurm job step, or None outside `srun` or on a single node.

    ``SLURM_STEP_ID`` marks a job step (plain `sbatch` scripts have no step); ``SLURM_NNODES`` gives
    num_machines, ``SLURM_NODEID`` machine_rank, and the first host of ``SLURM_JOB_NODELIST`` the
    main address. num_processes is left to the user (it depends on GPUs per node).
    """
    env = os.environ if environ is None else environ
    if "SLURM_STEP_ID" not in env or "SLURM_NNODES" not in env:
        return None
    try:
        nodes = int(env["SLURM_NNODES"])
        node_rank = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        return None
    if nodes <= 1:
        return None
    mapping: dict[str, Any] = {"num_machines": nodes, "machine_rank": node_rank}
    host = first_hostname(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
    if host:
        mapping["main_process_ip"] = host
    return mapping, SLURM_SOURCE
