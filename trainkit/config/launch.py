"""The resolved launch configuration: Accelerate's YAML keys as fields, validated, with provenance.

A :class:`LaunchConfig` is built from layers of plain mappings (defaults < default file < ``--config_file``
< flags); each value remembers which layer it came from so ``trainkit config --show`` can say so.
No torch here: the CLI validates a file before any worker starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .deepspeed import AutoValues, DeepSpeedPlugin, plugin_from_yaml_block, translate
from .dynamo import TorchDynamoPlugin
from .errors import ConfigError, check_choice, unknown_key_error
from .fsdp import FSDPOptions, option_name
from .machine import gpus_probably_present
from .preemption import DEFAULT_GRACE_PERIOD, DEFAULT_PREEMPTION_SIGNALS, parse_signal_names
from .values import (
    COMPUTE_ENVIRONMENTS,
    RDZV_BACKENDS,
    parse_distributed_type,
    parse_gpu_ids,
    parse_mixed_precision,
    to_bool,
    to_int,
    to_positive_float,
)

DEFAULT_SOURCE = "default"
# Keys of Accelerate's config files that trainkit reads but does not act on. A key whose value asks for
# nothing (empty, false, null) is absorbed silently; any other value is listed once in ``unused_keys``.
UNUSED_ACCELERATE_KEYS = frozenset({
    "megatron_lm_config", "tp_config", "fp8_config", "ipex_config", "mpirun_config",
    "parallelism_config", "enable_cpu_affinity", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_env", "command_file", "commands", "fp16",
})
# trainkit's own keys: written by ``to_dict()`` only when they differ from their defaults, so that a file
# ``trainkit config`` writes with defaults is still readable by ``accelerate launch`` (it rejects unknown keys).
TRAINKIT_ONLY_KEYS = (
    "gradient_accumulation_steps", "collective_timeout", "max_restarts", "monitor_interval",
    "num_cpu_threads_per_process", "preemption_signals", "preemption_grace_period",
)


@dataclasses.dataclass
class LaunchConfig:
    """Everything ``trainkit launch`` resolved, under the names of Accelerate's config file."""

    compute_environment: str = "LOCAL_MACHINE"
    """Only LOCAL_MACHINE (this machine or a cluster of them); SageMaker is not supported."""
    distributed_type: str = "NO"
    """NO | MULTI_CPU | MULTI_GPU | FSDP. MULTI_GPU/FSDP on a machine without GPUs run on CPU with gloo."""
    mixed_precision: str = "no"
    """no | fp16 | bf16."""
    use_cpu: bool = False
    """Run on CPU even where a GPU exists."""
    num_processes: int = 1
    """Total processes over all machines (as in Accelerate), not per machine."""
    num_machines: int = 1
    """Machines (nodes) taking part; ``num_processes`` must be a multiple of it."""
    machine_rank: int = 0
    """This machine's rank, 0 .. num_machines-1 (0 hosts the rendezvous)."""
    main_process_ip: str | None = None
    """Address of machine 0; needed when num_machines > 1."""
    main_process_port: int | None = None
    """Port of the rendezvous on machine 0; None = a free port (one machine) or 29500 (several)."""
    rdzv_backend: str = "static"
    """static | c10d: torchrun's rendezvous backend for several machines."""
    same_network: bool = True
    """Accelerate's key; accepted (false has no effect and is listed in ``unused_keys``)."""
    gpu_ids: str | None = "all"
    """"all" or a comma-separated list of GPU indices made visible to the workers."""
    debug: bool = False
    """Turn on torch's collective checks (TORCH_DISTRIBUTED_DEBUG=DETAIL)."""
    gradient_accumulation_steps: int = 1
    """Default for ``Accelerator(gradient_accumulation_steps=)`` when the script does not pass one."""
    fsdp_config: FSDPOptions | None = None
    """FSDP options; present exactly when distributed_type is FSDP."""
    main_training_function: str = "main"
    """Accelerate's key (used by notebook launchers); accepted (another name is listed in ``unused_keys``)."""
    downcast_bf16: bool = False
    """Accelerate's TPU key; accepted (written as 'no'/'yes' like Accelerate; 'yes' is listed in ``unused_keys``)."""
    collective_timeout: float = 600.0
    """Seconds before a collective that never completes fails the job (gloo's own default is 30 min)."""
    max_restarts: int = 0
    """Restarts of the whole worker group after a failure (torchrun's --max-restarts)."""
    monitor_interval: float = 0.1
    """Seconds between torchrun's checks of worker health."""
    num_cpu_threads_per_process: int | None = None
    """OMP_NUM_THREADS per worker; None = cores / processes on this machine (decided by the launcher)."""
    deepspeed_config: dict[str, Any] | None = None
    """Accelerate's ``deepspeed_config`` block (zero_stage, offload_*, deepspeed_config_file, ...); present
    exactly when distributed_type is DEEPSPEED, and run on FSDP2/DDP (``trainkit.config.deepspeed``)."""
    dynamo_config: dict[str, Any] | None = None
    """torch.compile settings (``dynamo_backend``, ``dynamo_mode``, ``dynamo_use_fullgraph``,
    ``dynamo_use_dynamic``, ``dynamo_use_regional_compilation``); None compiles nothing."""
    preemption_signals: str = DEFAULT_PREEMPTION_SIGNALS
    """Signals the launcher forwards to every worker and the workers answer by saving a checkpoint and
    stopping (comma-separated names; a YAML list works too). See docs/preemption.md."""
    preemption_grace_period: int = DEFAULT_GRACE_PERIOD
    """Seconds the launcher waits for its workers to save and exit after forwarding a signal, before SIGKILL."""
    unused_keys: list[str] = dataclasses.field(default_factory=list)
    """Keys accepted but not acted on (Accelerate's deepspeed_config, tpu_*, ...), reported once."""
    provenance: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """Where each value came from: "default", a file path, "flag", ... (keys: field names and
    ``fsdp_config.fsdp_<option>``)."""

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        """The keys a config mapping may hold (besides Accelerate's unused ones)."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("unused_keys", "provenance")]

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, source: str = "mapping",
                     cuda_available: bool | None = None) -> LaunchConfig:
        """Build from one mapping (a parsed config file); missing keys take their defaults."""
        return cls.resolve([(mapping, source)], cuda_available=cuda_available)

    @classmethod
    def from_file(cls, path: str, *, cuda_available: bool | None = None) -> LaunchConfig:
        """Read a YAML or JSON config file (``trainkit config``'s or Accelerate's)."""
        from .files import read_mapping_file

        return cls.from_mapping(read_mapping_file(path), source=str(path), cuda_available=cuda_available)

    @classmethod
    def resolve(cls, layers: Sequence[tuple[Mapping[str, Any], str]], *,
                cuda_available: bool | None = None) -> LaunchConfig:
        """Merge ``(mapping, source)`` layers, later ones winning key by key, then validate.

        ``fsdp_config`` sections merge option by option (a flag ``fsdp_sharding_strategy`` overrides only
        that option of the file's section). ``cuda_available`` decides what ``num_processes > 1`` with
        distributed_type NO becomes (MULTI_GPU or MULTI_CPU); None means "ask a torch-free probe of this machine".
        """
        merged: dict[str, Any] = {}
        fsdp_merged: dict[str, tuple[str, Any]] = {}
        provenance: dict[str, str] = {}
        unused: list[str] = []
        for mapping, source in layers:
            _merge_layer(mapping, source, merged, fsdp_merged, provenance, unused)
        config = cls(**merged, unused_keys=unused, provenance=provenance)
        config._finish(fsdp_merged, cuda_available)
        return config

    # ----------------------------------------------------------------------------------------------
    def _finish(self, fsdp_options: dict[str, tuple[str, Any]], cuda_available: bool | None) -> None:
        """Validate every field, derive what depends on others, fill provenance for defaults."""
        fsdp_mapping = dict(fsdp_options.values())
        if "num_processes" not in self.provenance and "num_machines" in self.provenance:
            # Only the machine count given: one process per machine rather than an impossible total of 1.
            self.num_processes = self.num_machines
            self.provenance["num_processes"] = "derived from num_machines"
        self._validate_fields()
        if self.distributed_type == "NO" and self.num_processes > 1:
            # What runs here: MULTI_CPU without a GPU (torch's answer when the launcher has it, else a
            # torch-free probe), so `trainkit config --show` and the launch agree.
            gpus = gpus_probably_present() if cuda_available is None else cuda_available
            gpu = gpus and not self.use_cpu
            self.distributed_type = "MULTI_GPU" if gpu else "MULTI_CPU"
            reason = "use_cpu" if self.use_cpu else "GPUs found" if gpus else "no GPU found"
            self.provenance["distributed_type"] = f"derived from num_processes > 1 ({reason})"
        if self.distributed_type == "FSDP":
            self.fsdp_config = FSDPOptions.from_mapping(fsdp_mapping, where=self._fsdp_where(),
                                                        sources=self._fsdp_sources(fsdp_options))
            self.unused_keys.extend(k for k in self.fsdp_config.ignored_keys if k not in self.unused_keys)
        else:
            if fsdp_mapping:
                FSDPOptions.check_mapping(fsdp_mapping, where=self._fsdp_where(),  # a typo is still a typo
                                          sources=self._fsdp_sources(fsdp_options))
                if "fsdp_config" not in self.unused_keys:
                    self.unused_keys.append("fsdp_config")
            self.fsdp_config = None
        # Accelerate's informational keys: their default values are what trainkit does anyway; any other
        # value asks for something trainkit does not do (a TPU cast, a notebook entry point), so it is listed.
        for name, does_nothing in (("downcast_bf16", self.downcast_bf16), ("same_network", not self.same_network),
                                   ("main_training_function", self.main_training_function != "main")):
            if does_nothing and name not in self.unused_keys:
                self.unused_keys.append(name)
        for name in self.field_names():
            self.provenance.setdefault(name, DEFAULT_SOURCE)
        if self.fsdp_config is not None:
            for name in FSDPOptions.field_names():
                self.provenance.setdefault(f"fsdp_config.fsdp_{name}", DEFAULT_SOURCE)

    def _fsdp_sources(self, fsdp_options: Mapping[str, tuple[str, Any]]) -> dict[str, str]:
        """Each option's raw key -> ``fsdp_config (<its file or flag>)``, for errors naming the right layer."""
        return {raw_key: f"fsdp_config ({_where(self.provenance, f'fsdp_config.fsdp_{name}')})"
                for name, (raw_key, _) in fsdp_options.items()}

    def _fsdp_where(self) -> str:
        source = self.provenance.get("fsdp_config")
        return f"fsdp_config ({source})" if source else "fsdp_config"

    def _validate_fields(self) -> None:
        where = _where(self.provenance, "compute_environment")
        if str(self.compute_environment).upper() == "AMAZON_SAGEMAKER":
            raise ConfigError(f"compute_environment 'AMAZON_SAGEMAKER' ({where}) is not supported by trainkit; "
                              "use LOCAL_MACHINE.")
        self.compute_environment = check_choice("compute_environment", self.compute_environment,
                                                COMPUTE_ENVIRONMENTS, where=where)
        self.distributed_type = parse_distributed_type(self.distributed_type, _where(self.provenance, "distributed_type"))
        self.mixed_precision = parse_mixed_precision(self.mixed_precision, _where(self.provenance, "mixed_precision"))
        for name in ("use_cpu", "same_network", "debug", "downcast_bf16"):
            setattr(self, name, to_bool(name, getattr(self, name), _where(self.provenance, name)))
        for name, minimum in (("num_processes", 1), ("num_machines", 1), ("machine_rank", 0),
                              ("gradient_accumulation_steps", 1), ("max_restarts", 0)):
            setattr(self, name, to_int(name, getattr(self, name), _where(self.provenance, name), minimum=minimum))
        for name in ("collective_timeout", "monitor_interval"):
            setattr(self, name, to_positive_float(name, getattr(self, name), _where(self.provenance, name)))
        if self.num_cpu_threads_per_process is not None:
            self.num_cpu_threads_per_process = to_int(
                "num_cpu_threads_per_process", self.num_cpu_threads_per_process,
                _where(self.provenance, "num_cpu_threads_per_process"), minimum=1)
        self.preemption_signals = parse_signal_names(self.preemption_signals, _where(self.provenance, "preemption_signals"))
        self.preemption_grace_period = to_int("preemption_grace_period", self.preemption_grace_period,
                                              _where(self.provenance, "preemption_grace_period"), minimum=0)
        if self.main_process_port is not None:
            port = to_int("main_process_port", self.main_process_port, _where(self.provenance, "main_process_port"),
                          minimum=0)
            if port > 65535:
                raise ConfigError(f"Invalid value {port} for 'main_process_port' "
                                  f"in {_where(self.provenance, 'main_process_port')}: ports run 0-65535.")
            self.main_process_port = port or None  # 0 means "pick one", like None
        if self.main_process_ip is not None:
            self.main_process_ip = str(self.main_process_ip).strip() or None
        self.rdzv_backend = check_choice("rdzv_backend", self.rdzv_backend or "static", RDZV_BACKENDS,
                                         where=_where(self.provenance, "rdzv_backend"))
        self.gpu_ids = parse_gpu_ids(self.gpu_ids)
        self.main_training_function = str(self.main_training_function or "main")
        self._finish_deepspeed()
        self.unused_keys.sort()  # one stable order for the notice, whichever section found them
        if self.dynamo_config is not None:
            if not isinstance(self.dynamo_config, Mapping):
                raise ConfigError(f"'dynamo_config' in {_where(self.provenance, 'dynamo_config')} must be a mapping, "
                                  f"got {self.dynamo_config!r}.")
            plugin = TorchDynamoPlugin.from_config(self.dynamo_config, where=_where(self.provenance, "dynamo_config"))
            self.dynamo_config = plugin.to_config() if plugin.enabled else None
        self._validate_machines()

    def _finish_deepspeed(self) -> None:
        block = self.deepspeed_config
        if block is not None and not isinstance(block, Mapping):
            raise ConfigError(f"'deepspeed_config' in {_where(self.provenance, 'deepspeed_config')} must be a mapping.")
        if self.distributed_type != "DEEPSPEED":
            if block and _asks_for_something(block) and "deepspeed_config" not in self.unused_keys:
                self.unused_keys.append("deepspeed_config")
            self.deepspeed_config = None
            return
        self.deepspeed_config = dict(block or {})
        plugin = self.deepspeed_plugin()  # validates the block (and the JSON file it names) now, in the launcher
        if plugin is not None:  # and what it asks for (NVMe offload, ZeRO++, ...) before any worker starts
            translate(plugin.deepspeed_config, AutoValues(), where=f"deepspeed_config "
                      f"({_where(self.provenance, 'deepspeed_config')})")

    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The ``deepspeed_config`` block as Accelerate's ``DeepSpeedPlugin`` (None unless DEEPSPEED)."""
        if self.distributed_type != "DEEPSPEED" or self.deepspeed_config is None:
            return None
        return plugin_from_yaml_block(self.deepspeed_config, where=f"deepspeed_config "
                                      f"({_where(self.provenance, 'deepspeed_config')})")

    def _validate_machines(self) -> None:
        if self.num_processes % self.num_machines:
            raise ConfigError(
                f"num_processes ({self.num_processes}, {_where(self.provenance, 'num_processes')}) is the total over "
                f"all machines and must be a multiple of num_machines ({self.num_machines}).")
        if self.machine_rank >= self.num_machines:
            raise ConfigError(
                f"machine_rank {self.machine_rank} ({_where(self.provenance, 'machine_rank')}) must be below "
                f"num_machines ({self.num_machines}): machines are numbered 0..{self.num_machines - 1}.")

    # ----------------------------------------------------------------------------------------------
    @property
    def processes_per_machine(self) -> int:
        """Workers started on this machine (``num_processes`` is the total over all machines)."""
        return self.num_processes // self.num_machines

    def to_dict(self, *, full: bool = False) -> dict[str, Any]:
        """The mapping Accelerate writes (fsdp_config with ``fsdp_``-prefixed keys).

        trainkit's own keys appear only where they differ from their defaults, unless ``full`` is true
        (used for the hand-off to workers, where the file is never read by Accelerate).
        """
        defaults = LaunchConfig()
        result: dict[str, Any] = {}
        for name in self.field_names():
            value = getattr(self, name)
            if name == "fsdp_config":
                value = self.fsdp_config.to_accelerate_dict() if self.fsdp_config is not None else {}
                value = {k: v for k, v in value.items() if full or v is not None}
            elif name == "downcast_bf16":
                value = "yes" if value else "no"
            elif name in TRAINKIT_ONLY_KEYS and not full and value == getattr(defaults, name):
                continue
            elif value is None and not full:
                continue  # Accelerate drops nulls too
            result[name] = value
        return result

    def source_of(self, key: str) -> str:
        """Where ``key`` (a field name or ``fsdp_config.fsdp_<option>``) came from."""
        return self.provenance.get(key, DEFAULT_SOURCE)

    def unused_keys_notice(self) -> str | None:
        """One line naming the accepted-but-unused keys, or None when there are none."""
        if not self.unused_keys:
            return None
        return ("trainkit: these config keys are accepted but have no effect here: "
                + ", ".join(self.unused_keys) + ".")


# -------------------------------------------------------------------------------------------------
def _merge_layer(mapping: Mapping[str, Any], source: str, merged: dict[str, Any],
                 fsdp_merged: dict[str, tuple[str, Any]],
                 provenance: dict[str, str], unused: list[str]) -> None:
    """Fold one layer into ``merged``: known keys replace, fsdp_config merges per option."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{source}: a configuration must be a mapping of keys to values, got {type(mapping).__name__}.")
    known = LaunchConfig.field_names()
    for key, value in mapping.items():
        if key == "fsdp_config":
            if isinstance(value, FSDPOptions):
                value = value.to_accelerate_dict()
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"'fsdp_config' in {source} must be a mapping, got {value!r}.")
            for raw_key, option in value.items():
                name = option_name(raw_key)  # one name per option, for merging layers key by key
                fsdp_merged[name] = (raw_key, option)  # keep the user's spelling for error messages
                provenance[f"fsdp_config.fsdp_{name}"] = source
            provenance["fsdp_config"] = source
        elif key == "deepspeed_config" and isinstance(value, Mapping):
            merged["deepspeed_config"] = {**(merged.get("deepspeed_config") or {}), **value}  # key by key
            provenance["deepspeed_config"] = source
        elif key == "dynamo_backend" or (key == "dynamo_config" and isinstance(value, Mapping)):
            block = {"dynamo_backend": value} if key == "dynamo_backend" else value
            merged["dynamo_config"] = {**(merged.get("dynamo_config") or {}), **block}  # merge key by key
            provenance["dynamo_config"] = source
        elif key in known:
            if key == "num_processes" and value in (None, -1):
                continue  # Accelerate's "not specified"
            merged[key] = value
            provenance[key] = source
        elif key in UNUSED_ACCELERATE_KEYS:
            if key == "fp16" and to_bool("fp16", value, source) and "mixed_precision" not in mapping:
                merged["mixed_precision"] = "fp16"  # Accelerate's pre-mixed_precision spelling
                provenance["mixed_precision"] = source
            elif _asks_for_something(value) and key not in unused:
                unused.append(key)
        else:
            raise unknown_key_error(key, known, where=source)


def _asks_for_something(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "no", "false", "none")
    return bool(value)


def _where(provenance: Mapping[str, str], key: str) -> str:
    return provenance.get(key, DEFAULT_SOURCE)
