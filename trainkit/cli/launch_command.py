"""`trainkit launch`: resolve the config, hand it to the workers, start them through torchrun.

The steps before anything starts are in ``launch_steps`` (Accelerate's ``_validate_launch_command`` and
``prepare_simple_launcher_cmd_env``). One process on one machine is a plain ``exec`` of the script (no agent, no
rendezvous), unless a setting only torchrun's agent acts on is given (``--tee``, ``--log_dir``, restarts, ...: see ``launch_settings``).
Everything else runs ``torch.distributed.run`` in this process, each worker through
``python -m trainkit.cli.worker`` (dies with this launcher, records its exception for the summary).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainkit.config import LaunchConfig
from trainkit.config.preemption import PREEMPTION_REPORT_ENV

from .config_flags import add_config_flags, config_layers, resolve_config
from .launch_settings import agent_settings_given, no_effect_notice
from .launch_steps import _validate_launch_command, launch_environment, prepare_simple_launcher_cmd_env
from .signal_relay import SignalRelay, can_find_children
from .torchrun_compat import SignalPlan, installed_torchrun_options, plan_signals, unknown_options
from .torchrun_env import override_notice, undecidable_notice
from .torchrun_flags import add_torchrun_flags

HELP = "Launch a training script on N processes (torchrun underneath), with Accelerate's flags and config files."
DESCRIPTION = HELP + "\nEvery --flag_name also takes its hyphen spelling (--num-processes for --num_processes)."
DEFAULT_MULTI_MACHINE_PORT = 29500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Config flags, torchrun's output options, then the script and its arguments."""
    add_config_flags(parser)
    output = parser.add_argument_group("worker output")
    output.add_argument("--tee", default=None,
                        help="Tee workers' streams to log files too: 0 none, 1 stdout, 2 stderr, 3 both (torchrun's --tee).")
    output.add_argument("--log_dir", default=None, help="Folder for the workers' log files (torchrun's --log-dir).")
    parser.add_argument("-m", "--module", action="store_true",
                        help="Run the target as a Python module (python -m), not a script path.")
    add_torchrun_flags(parser)  # after trainkit's own: an option string both have is trainkit's (same setting)
    parser.add_argument("training_script", help="The script (or module with -m) to run on every process.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit launch``'s own)."""
    from .command_parser import command_parser

    return command_parser("launch", sys.modules[__name__], subparsers)


def launch_command(args: argparse.Namespace) -> None:
    """Accelerate's Python entry point: launch as ``trainkit launch`` does, from a caller that keeps running.

    One process runs as a child (not ``exec``: the caller stays); the launch's variables are set for the workers
    only (this process's environment is restored after). A bad config raises ConfigError (a ValueError) before
    anything starts; a failed run raises ``subprocess.CalledProcessError``.
    """
    saved = dict(os.environ)
    try:
        status = run(args, replace_process=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if status:
        raise subprocess.CalledProcessError(status, ["trainkit", "launch", args.training_script])


def run(args: argparse.Namespace, *, replace_process: bool = True) -> int:
    """Resolve, then exec (one process) or run torchrun (several); returns the exit status.

    ``replace_process=False``: one process runs as a child instead of replacing this one (:func:`launch_command`).
    """
    args, config, _ = _validate_launch_command(args)
    if not args.module and not Path(args.training_script).is_file():
        print(f"trainkit launch: error: script {args.training_script!r} not found "
              "(use -m for a module name).", file=sys.stderr)
        return 2
    agent_settings = agent_settings_given(config, args)
    # One process, one machine, nothing for torchrun's agent to do: exec the script itself.
    single = config.num_processes == 1 and config.num_machines == 1 and not agent_settings
    if not single:
        import torch  # only now: the one-process path never pays for it here

        gpus: bool | None = torch.cuda.is_available()
        if config.source_of("distributed_type").startswith("derived from num_processes"):
            # Only this choice came from the torch-free GPU probe: decide it again with torch's answer. Every
            # other value (FSDP options included) is already resolved and is not parsed a second time.
            config = resolve_config(args, cuda_available=gpus)
        _check_gpus(config, torch)
    else:
        gpus = None  # no torch import for one process: the notice asks a torch-free probe
    notices = (config.unused_keys_notice(), no_effect_notice(config, single_process=single, gpus=gpus),
               override_notice(config_layers(args)), undecidable_notice(), elastic_notice(config))
    for notice in notices:
        if notice:
            print(notice, file=sys.stderr)
    if single:
        return _run_single_process(args, replace_process)  # with replace_process, does not return
    os.environ.update(launch_environment(config))
    return _run_torchrun(config, args)


def elastic_notice(config: LaunchConfig) -> str | None:
    """One line for an elastic job that cannot survive a machine leaving (no restarts allowed), else None."""
    if config.elastic and config.max_restarts == 0:
        return (f"trainkit launch: num_machines {config.machine_range} with max_restarts 0: machines may join, but "
                "one leaving ends the job; pass --max_restarts K to let the others continue.")
    return None


def _check_gpus(config: LaunchConfig, torch: Any) -> None:
    """Before any worker starts: every process of this machine needs a GPU of its own (unless on CPU)."""
    if config.use_cpu or not torch.cuda.is_available():
        return
    from trainkit.engine import check_processes_fit_gpus

    visible = torch.cuda.device_count()
    if config.gpu_ids not in (None, "all"):
        visible = min(visible, len(str(config.gpu_ids).split(",")))
    check_processes_fit_gpus(config.processes_per_machine, visible, where="trainkit launch")


def _run_single_process(args: argparse.Namespace, replace_process: bool) -> int:
    command, environment = prepare_simple_launcher_cmd_env(args)
    sys.stdout.flush()
    sys.stderr.flush()
    if not replace_process:
        return subprocess.run(command, env=environment).returncode
    os.execve(sys.executable, command, environment)
    raise AssertionError("os.execve returned")


def signal_plan(config: LaunchConfig, options: frozenset[str] | None = None) -> SignalPlan:
    """How this launch's preemption signals reach the workers with the installed (or given) torchrun options."""
    import torch

    return plan_signals(config.preemption_signals, config.preemption_grace_period,
                        installed_torchrun_options() if options is None else options,
                        can_relay=can_find_children(), torch_version=torch.__version__)


def torchrun_arguments(config: LaunchConfig, args: argparse.Namespace, options: frozenset[str] | None = None) -> list[str]:
    """The argv handed to ``torch.distributed.run`` for this launch, using only options its parser has.

    ``options``: the torchrun parser's option strings (default: the installed torch's).
    """
    known = installed_torchrun_options() if options is None else options
    argv = [
        "--nnodes", config.machine_range,
        "--nproc_per_node", str(config.processes_per_machine),
        "--max_restarts", str(config.max_restarts),
        "--monitor_interval", str(config.monitor_interval),
        # The agent forwards the preemption signals to every worker and waits the grace period before SIGKILL
        # where this torchrun can (else the launcher's relay does); the workers save and stop on them
        # (docs/preemption.md). torchrun's own SIGHUP/SIGQUIT handling is kept.
        *signal_plan(config, known).torchrun_arguments,
    ]
    argv += _rendezvous_arguments(config)
    if args.tee is not None:
        argv += ["--tee", str(args.tee)]
    if args.log_dir is not None:
        argv += ["--log_dir", str(args.log_dir)]
    unknown = unknown_options(argv, known)
    if unknown:  # a bug in this module, not the user's: say which option and which torch
        import torch

        raise RuntimeError(f"trainkit launch would pass {', '.join(unknown)} to torch {torch.__version__}'s "
                           "torchrun, whose parser lacks it.")
    argv += ["--module", "trainkit.cli.worker"]
    if args.module:
        argv.append("-m")
    argv.append(args.training_script)
    return argv + list(args.training_script_args)


def _rendezvous_arguments(config: LaunchConfig) -> list[str]:
    # Restarted attempts must not see the previous attempt's keys: with the agent's TCP store shared
    # across attempts (static always; c10d by default) a new rank reads a dead peer's address and gloo
    # fails or hangs (measured: 6/6 static and 4/6 c10d restarts failed on loopback). Unshared, c10d
    # gives every attempt a fresh store on a fresh port (10/10 restarts succeeded).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if config.num_machines == 1:
        # One machine: torchrun's c10d rendezvous on loopback; port 0 lets the OS pick a free one,
        # so concurrent jobs never collide.
        port = config.main_process_port or 0
        loopback = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "trainkit"]
        return loopback + (["--rdzv_conf", config.rdzv_conf] if config.rdzv_conf else [])
    address = config.main_process_ip
    if not address:
        from trainkit.config import ConfigError

        raise ConfigError("num_machines > 1 needs main_process_ip (the address of machine 0): "
                          "set it in the config file or pass --main_process_ip.")
    port = config.main_process_port or DEFAULT_MULTI_MACHINE_PORT
    backend = config.rdzv_backend
    if backend == "static" and config.max_restarts > 0:
        print("trainkit launch: --max_restarts with several machines uses the c10d rendezvous (a static one "
              "cannot re-form the group reliably); machine ranks are then assigned in joining order.", file=sys.stderr)
        backend = "c10d"
    if backend == "static":
        return ["--rdzv_backend", "static", "--node_rank", str(config.machine_rank),
                "--master_addr", address, "--master_port", str(port)]
    # c10d: every machine must name the same run id; machine 0 hosts the store (elastic jobs: it must stay).
    run_id = config.rdzv_id or os.environ.get("SLURM_JOB_ID") or f"trainkit-{address}-{port}"
    return ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{address}:{port}", "--rdzv_id", run_id,
            "--rdzv_conf", _rendezvous_options(config)]


def _rendezvous_options(config: LaunchConfig) -> str:
    """``is_host`` (machine 0 hosts the c10d store) plus the user's ``rdzv_conf``, which wins key by key."""
    options = {"is_host": "true" if config.machine_rank == 0 else "false"}
    for pair in filter(None, (part.strip() for part in (config.rdzv_conf or "").split(","))):
        key, _, value = pair.partition("=")
        options[key.strip()] = value.strip()
    return ",".join(f"{key}={value}" for key, value in options.items())


def _run_torchrun(config: LaunchConfig, args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run as torchrun

    from .failures import describe_failure, exit_status
    from .preemption_report import PreemptionReport

    plan = signal_plan(config)
    if plan.notice:
        print(plan.notice, file=sys.stderr)
    with PreemptionReport() as report, SignalRelay(plan.relayed, config.preemption_grace_period):
        os.environ[PREEMPTION_REPORT_ENV] = report.folder
        try:
            torchrun(parse_args(torchrun_arguments(config, args)))
        except ChildFailedError as error:
            sys.stdout.flush()
            if report.all_preempted(error):
                print(report.describe(None), file=sys.stderr)
                return report.exit_code
            for line in describe_failure(error, world_size=config.num_processes):
                print(line, file=sys.stderr)
            return exit_status(error)
        except SignalException as stopped:  # a forwarded signal: torchrun waited for the workers, then stopped them
            if report.saved_ranks():
                print(report.describe(stopped.sigval.name), file=sys.stderr)
                return report.exit_code
            print(f"trainkit launch: stopped by {stopped.sigval.name}; all workers were terminated.", file=sys.stderr)
            return 128 + int(stopped.sigval)
    return 0
