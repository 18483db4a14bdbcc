"""Which launch settings act on this launch, and one line for those that cannot.

A one-process launch on one machine normally ``exec``s the script (no torchrun agent, no rendezvous).
Settings only torchrun's agent acts on (log files, restarts, health checks, the signal grace period)
send such a launch through torchrun instead, so that they take effect; settings that cannot act on a
launch of this shape are named once, in one line, with the reason. No torch here.
"""

from __future__ import annotations

import argparse

from trainkit.config import LaunchConfig
from trainkit.config.machine import gpus_probably_present

from .torchrun_env import is_env_source

# `trainkit launch` flags that are torchrun options and nothing else (no config key): given, they act
# only through the agent. Flags passed through to torchrun belong here too.
AGENT_ONLY_FLAGS = ("tee", "log_dir")
# Config keys (flags or files) that only torchrun's agent acts on, when they differ from their defaults.
AGENT_ONLY_KEYS = ("max_restarts", "monitor_interval", "preemption_grace_period")


def agent_settings_given(config: LaunchConfig, args: argparse.Namespace) -> list[str]:
    """The given settings that need torchrun's agent (``--tee``, ``monitor_interval``, ...), as users spell them."""
    given = [f"--{name}" for name in AGENT_ONLY_FLAGS if getattr(args, name, None) is not None]
    defaults = LaunchConfig()
    given += [name for name in AGENT_ONLY_KEYS if getattr(config, name) != getattr(defaults, name)]
    return given


def no_effect_notice(config: LaunchConfig, *, single_process: bool, gpus: bool | None = None) -> str | None:
    """One line naming the given settings that do nothing on this launch, and why; None when all act.

    ``single_process``: the script is exec'd directly (one process, no torchrun agent). ``gpus``: whether
    this machine has a GPU (torch's answer when the launcher asked it; None: a torch-free probe).
    """
    reasons: list[str] = []
    has_gpus = gpus_probably_present() if gpus is None else gpus
    if config.distributed_type == "MULTI_GPU" and not config.use_cpu and not has_gpus:
        # FSDP says the same from the engine; MULTI_GPU would otherwise fall back to CPU silently.
        reasons.append("distributed_type MULTI_GPU (no GPU found: the processes run on CPU with gloo)")

    def given(name: str) -> bool:  # typed by the user (the cluster's environment sets what it does not use)
        source = config.source_of(name)
        return source != "default" and not source.startswith("derived") and not is_env_source(source)

    if config.num_machines == 1:
        if given("main_process_ip") and config.main_process_ip:
            reasons.append("main_process_ip (one machine: the processes meet on 127.0.0.1)")
        if given("rdzv_backend"):
            reasons.append("rdzv_backend (one machine: torchrun's c10d rendezvous on loopback)")
        if given("rdzv_id") and config.rdzv_id:
            reasons.append("rdzv_id (one machine: the rendezvous is local to this launch)")
    if single_process and given("main_process_port") and config.main_process_port:
        reasons.append("main_process_port (one process needs no rendezvous)")
    if given("gpu_ids") and config.gpu_ids not in (None, "all") and (config.use_cpu or not has_gpus):
        reasons.append("gpu_ids (use_cpu: the processes run on CPU)" if config.use_cpu else "gpu_ids (no GPU found)")
    if not reasons:
        return None
    return "trainkit launch: these settings have no effect on this launch: " + "; ".join(reasons) + "."
