"""The questions of `trainkit config`, in order, turning answers into a config mapping (Accelerate's keys).

Reads answers line by line from stdin, so answers can be piped in; an empty line or end of input takes
the default shown in brackets. An answer that is not valid is asked again (three times, then an error).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from trainkit.config import ConfigError, FSDPOptions, LaunchConfig, did_you_mean
from trainkit.config.machine import gpus_probably_present
from trainkit.config.options import declared_options
from trainkit.config.precision import MIXED_PRECISION

_MAX_ATTEMPTS = 3


class Asker:
    """Prompts on ``output`` and reads answers from ``source`` (stdin by default)."""

    def __init__(self, source: TextIO | None = None, output: TextIO | None = None) -> None:
        self.source = source or sys.stdin
        self.output = output or sys.stdout

    def _read(self, prompt: str) -> str:
        self.output.write(prompt)
        self.output.flush()
        line = self.source.readline()
        if not line:  # end of piped input: take the default
            self.output.write("\n")
            return ""
        if not self.source.isatty():
            self.output.write(line if line.endswith("\n") else line + "\n")  # echo, so logs read like a dialogue
        return line.strip()

    def ask(self, question: str, default: Any, parse: Callable[[str], Any]) -> Any:
        """Ask until ``parse`` accepts the answer (it raises ValueError with the reason otherwise)."""
        for _ in range(_MAX_ATTEMPTS):
            answer = self._read(f"{question} [{_show(default)}]: ")
            if answer == "":
                return default
            try:
                return parse(answer)
            except ValueError as reason:
                self.output.write(f"  {reason}\n")
        raise ConfigError(f"No valid answer to {question!r} after {_MAX_ATTEMPTS} attempts.")

    def yes_no(self, question: str, default: bool) -> bool:
        return self.ask(f"{question} (yes/no)", default, _parse_yes_no)

    def choice(self, question: str, choices: Sequence[str], default: str, first_number: int = 0) -> str:
        """Ask for one of ``choices``, by name or by its number (numbered from ``first_number``)."""
        listing = ", ".join(f"[{i}] {c}" for i, c in enumerate(choices, start=first_number))
        return self.ask(f"{question} {listing}", default, lambda text: _parse_choice(text, choices, first_number))

    def integer(self, question: str, default: int, minimum: int = 0) -> int:
        return self.ask(question, default, lambda text: _parse_int(text, minimum))

    def text(self, question: str, default: str | None) -> str | None:
        return self.ask(question, default, lambda text: text)


def _show(default: Any) -> str:
    if isinstance(default, bool):
        return "yes" if default else "no"
    return "" if default is None else str(default)


def _parse_yes_no(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("y", "yes", "true", "1"):
        return True
    if lowered in ("n", "no", "false", "0"):
        return False
    raise ValueError(f"Please answer yes or no, not {text!r}.")


def _parse_choice(text: str, choices: Sequence[str], first_number: int = 0) -> str:
    if text.isdigit() and first_number <= int(text) < first_number + len(choices):
        return choices[int(text) - first_number]
    for choice in choices:
        if text.lower() == choice.lower():
            return choice
    guess = did_you_mean(text, choices)
    hint = f" Did you mean {guess!r}?" if guess else ""
    raise ValueError(f"{text!r} is not one of {', '.join(choices)}.{hint}")


def _parse_int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"Please give a whole number, not {text!r}.") from None
    if value < minimum:
        raise ValueError(f"Please give a number >= {minimum}.")
    return value


def ask_launch_config(asker: Asker) -> dict[str, Any]:
    """Ask every question in order and return the config mapping (Accelerate's keys)."""
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    machines = 1
    if asker.choice("Where will you train?", ["this machine", "several machines"], "this machine") != "this machine":
        machines = asker.integer("How many machines?", 2, minimum=2)
        config["num_machines"] = machines
        config["machine_rank"] = asker.integer("What is the rank of this machine (0 = main)?", 0, minimum=0)
        config["main_process_ip"] = asker.text("What is the IP address of machine 0?", "127.0.0.1")
        config["main_process_port"] = asker.integer("Which port on machine 0 for the rendezvous?", 29500, minimum=1)
        backend = declared_options(LaunchConfig)["rdzv_backend"]
        config["rdzv_backend"] = asker.choice("Which rendezvous backend?", backend.choices, backend.default)
        config["same_network"] = asker.yes_no("Are all machines on the same local network?", True)
    gpus = gpus_probably_present()
    config["use_cpu"] = asker.yes_no("Run on CPU only (even where GPUs exist)?", not gpus)
    config["mixed_precision"] = asker.choice("Mixed precision?", MIXED_PRECISION.choices, MIXED_PRECISION.default)
    use_fsdp = asker.yes_no("Use FSDP (shard parameters, gradients and optimizer state)?", False)
    if use_fsdp:
        config["fsdp_config"] = ask_fsdp_options(asker)
    use_deepspeed = not use_fsdp and asker.yes_no("Use a DeepSpeed config (ZeRO stages, run on FSDP2)?", False)
    if use_deepspeed:
        config["deepspeed_config"] = ask_deepspeed_options(asker)
    processes = asker.integer("How many processes in total (over all machines)?", machines, minimum=1)
    config["num_processes"] = processes
    if use_fsdp or use_deepspeed:
        config["distributed_type"] = "FSDP" if use_fsdp else "DEEPSPEED"
    elif processes > 1:
        config["distributed_type"] = "MULTI_CPU" if config["use_cpu"] or not gpus else "MULTI_GPU"
    else:
        config["distributed_type"] = "NO"
    config["debug"] = False
    return config


def ask_fsdp_options(asker: Asker) -> dict[str, Any]:
    """The FSDP questions, each with its declared choices and default; answers keyed with Accelerate's ``fsdp_``
    prefix."""
    defaults = FSDPOptions()
    declared = declared_options(FSDPOptions)
    options: dict[str, Any] = {
        # Numbered 1-5 as FSDP itself numbers them (ShardingStrategy) and as the guides say "select 1 for FULL_SHARD".
        "fsdp_sharding_strategy": asker.choice("Sharding strategy?", declared["sharding_strategy"].choices,
                                               defaults.sharding_strategy, first_number=1),
        "fsdp_offload_params": asker.yes_no("Offload parameters and optimizer state to CPU?", defaults.offload_params),
    }
    policy = asker.choice("Auto-wrap policy?", declared["auto_wrap_policy"].choices, "TRANSFORMER_BASED_WRAP")
    options["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        layers = asker.text("Layer classes to wrap, comma-separated (empty: the model's _no_split_modules)?", None)
        if layers:
            options["fsdp_transformer_layer_cls_to_wrap"] = layers
    elif policy == "SIZE_BASED_WRAP":
        options["fsdp_min_num_params"] = asker.integer("Minimum parameters per wrapped unit?", defaults.min_num_params)
    options["fsdp_backward_prefetch"] = asker.choice("Backward prefetch?", declared["backward_prefetch"].choices,
                                                     defaults.backward_prefetch or "NO_PREFETCH")
    options["fsdp_forward_prefetch"] = asker.yes_no("Forward prefetch?", defaults.forward_prefetch)
    options["fsdp_state_dict_type"] = asker.choice("State dict type for checkpoints?", declared["state_dict_type"].choices,
                                                   defaults.state_dict_type)
    efficient = asker.yes_no("CPU-RAM-efficient loading (only rank 0 loads weights)?", defaults.cpu_ram_efficient_loading)
    options["fsdp_cpu_ram_efficient_loading"] = efficient
    options["fsdp_sync_module_states"] = True if efficient else asker.yes_no(
        "Broadcast rank 0's weights to the others when sharding?", defaults.sync_module_states)
    options["fsdp_activation_checkpointing"] = asker.yes_no("Activation checkpointing?", defaults.activation_checkpointing)
    options["fsdp_use_orig_params"] = True
    return options


def ask_deepspeed_options(asker: Asker) -> dict[str, Any]:
    """Accelerate's DeepSpeed questions: a JSON config file, or the ZeRO stage and its options."""
    path = asker.text("DeepSpeed JSON config file (empty: answer the ZeRO questions instead)?", None)
    if path:  # as `accelerate config` does, zero3_init_flag is asked beside a file too (the file rarely holds it)
        return {"deepspeed_config_file": path, "zero3_init_flag": asker.yes_no(
            "Build the model on the meta device, rank 0 loading the weights (zero3_init_flag)?", False)}
    stage = int(asker.choice("ZeRO stage (0 DDP, 1 + sharded optimizer state, 2 FSDP2 SHARD_GRAD_OP, "
                             "3 FSDP2 FULL_SHARD)?", ["0", "1", "2", "3"], "2"))
    options: dict[str, Any] = {"zero_stage": stage}
    if stage == 3:
        offload = asker.yes_no("Offload parameters and optimizer state to CPU?", False)
        options["offload_optimizer_device"] = options["offload_param_device"] = "cpu" if offload else "none"
        options["zero3_init_flag"] = asker.yes_no("Build the model on the meta device, rank 0 loading the weights?",
                                                  False)
        options["zero3_save_16bit_model"] = asker.yes_no("Save full (gathered) weights rather than shards?", True)
    options["gradient_accumulation_steps"] = asker.integer("Gradient accumulation steps?", 1, minimum=1)
    return options
