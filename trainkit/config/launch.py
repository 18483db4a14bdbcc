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
from .parallelism import ParallelismConfig
from .engine_options import COLLECTIVE_TIMEOUT, GRADIENT_ACCUMULATION_STEPS, USE_CPU
from .options import Option, boolean, integer, optional, parse_declared, seconds
from .precision import MIXED_PRECISION, option_blocks
from .preemption import PREEMPTION_GRACE_PERIOD, PREEMPTION_SIGNALS
from .values import COMPUTE_ENVIRONMENTS, DISTRIBUTED_TYPES, RDZV_BACKENDS, parse_distributed_type, parse_gpu_ids, to_bool, to_int

DEFAULT_SOURCE = "default"
_NOT_KEYS = ("unused_keys", "provenance", "precision_config", "_parallelism")  # fields that are not keys of a config file
# Keys of Accelerate's config files that trainkit reads but does not act on. A key whose value asks for
# nothing (empty, false, null) is absorbed silently; any other value is listed once in ``unused_keys``.
UNUSED_ACCELERATE_KEYS = frozenset({
    "megatron_lm_config", "tp_config", "fp8_config", "ipex_config", "mpirun_config",
    "enable_cpu_affinity", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_env", "command_file", "commands", "fp16",
})
# trainkit's own keys: written by ``to_dict()`` only when they differ from their defaults, so that a file
# ``trainkit config`` writes with defaults is still readable by ``accelerate launch`` (it rejects unknown keys).
TRAINKIT_ONLY_KEYS = (
    "gradient_accumulation_steps", "collective_timeout", "max_restarts", "monitor_interval",
    "num_cpu_threads_per_process", "preemption_signals", "preemption_grace_period", "min_machines", "rdzv_conf",
    "rdzv_id",
)


@dataclasses.dataclass
class LaunchConfig:
    """Everything ``trainkit launch`` resolved, under the names of Accelerate's config file.

    Each plain key is declared once, with its :class:`~trainkit.config.options.Option` (default, help, parser,
    flag, environment variables); the sections (``fsdp_config``, ``deepspeed_config``, ``dynamo_config``,
    ``parallelism_config``) are declared in their own modules.
    """

    compute_environment: str = Option(
        help="Only LOCAL_MACHINE (this machine or a cluster of them); SageMaker is not supported.",
        default="LOCAL_MACHINE", parse=lambda value, key, where: _parse_compute_environment(value, where),
        flag=False).field()
    distributed_type: str = Option(
        help=f"One of {', '.join(DISTRIBUTED_TYPES)} (normally implied by the flags below).", default="NO",
        parse=lambda value, key, where: parse_distributed_type(value, where)).field()
    """NO | MULTI_CPU | MULTI_GPU | FSDP | DEEPSPEED. MULTI_GPU/FSDP on a machine without GPUs run on CPU with gloo."""
    mixed_precision: str = MIXED_PRECISION.field()
    use_cpu: bool = USE_CPU.field()
    num_processes: int = Option(help="Total processes over all machines (as in Accelerate).", default=1,
                                parse=integer(1), flag_type=int).field()
    """Total processes over all machines (as in Accelerate), not per machine."""
    num_machines: int = Option(
        help="Number of machines (nodes), or MIN:MAX for an elastic job (c10d rendezvous; machines may leave and "
             "join, the workers resume with the same global batch).", default=1, parse=integer(1),
        env=("PET_NNODES",)).field()
    """Machines (nodes) taking part; ``num_processes`` must be a multiple of it. ``"MIN:MAX"`` (a flag, a file,
    or ``PET_NNODES``) makes an elastic job: this field takes MAX and ``min_machines`` MIN."""
    min_machines: int | None = Option(
        help="Fewest machines an elastic job keeps running on (given as num_machines MIN:MAX).", flag=False).field()
    """Fewest machines an elastic job keeps running on (torchrun's ``--nnodes MIN:MAX``); None = exactly
    ``num_machines``. Machines may leave and join between MIN and ``num_machines``; each change restarts the
    workers, which resume from the last checkpoint with the same global batch (docs/clusters.md)."""
    machine_rank: int = Option(help="This machine's rank, 0 .. num_machines-1.", default=0, parse=integer(0),
                               flag_type=int, env=("PET_NODE_RANK",)).field()
    """This machine's rank, 0 .. num_machines-1 (0 hosts the rendezvous)."""
    main_process_ip: str | None = Option(
        help="Address of machine 0 (multi-machine jobs).", parse=lambda value, key, where: _text_or_none(value),
        env=("MASTER_ADDR", "PET_MASTER_ADDR")).field()
    """Address of machine 0; needed when num_machines > 1."""
    main_process_port: int | None = Option(
        help="Rendezvous port on machine 0 (default: a free port on one machine, 29500 on several).",
        parse=lambda value, key, where: _parse_port(value, where), flag_type=int,
        env=("MASTER_PORT", "PET_MASTER_PORT")).field()
    """Port of the rendezvous on machine 0; None = a free port (one machine) or 29500 (several)."""
    rdzv_backend: str = Option(
        help=f"Rendezvous backend for several machines: {', '.join(RDZV_BACKENDS)}.", default="static",
        choices=RDZV_BACKENDS, parse=lambda value, key, where: check_choice(key, value or "static", RDZV_BACKENDS,
                                                                               where=where),
        env=("PET_RDZV_BACKEND",)).field()
    """static | c10d: torchrun's rendezvous backend for several machines (an elastic job always uses c10d)."""
    rdzv_conf: str | None = Option(
        help="Extra c10d rendezvous options, key=value,... (e.g. last_call_timeout=5).",
        parse=lambda value, key, where: _parse_rdzv_conf(value, where), env=("PET_RDZV_CONF",)).field()
    """Extra rendezvous options for c10d, ``key=value,...`` (torchrun's ``--rdzv_conf``: ``last_call_timeout``,
    ``join_timeout``, ``close_timeout``, ...); trainkit adds ``is_host`` unless given."""
    rdzv_id: str | None = Option(
        help="Run id that every machine of a c10d rendezvous names (default: SLURM_JOB_ID, else one made of the "
             "address and port).", parse=lambda value, key, where: _text_or_none(value), env=("PET_RDZV_ID",)).field()
    same_network: bool = Option(help="Accelerate's key; accepted (false has no effect and is listed in "
                                "unused_keys).", default=True, parse=boolean, flag=False).field()
    gpu_ids: str | None = Option(help="GPUs to use on this machine: 'all' or a comma-separated list.",
                                 default="all", parse=lambda value, key, where: parse_gpu_ids(value)).field()
    """"all" or a comma-separated list of GPU indices made visible to the workers."""
    debug: bool = Option(help="Check that every rank calls the same collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL).",
                         default=False, parse=boolean, flag=False).field()
    gradient_accumulation_steps: int = GRADIENT_ACCUMULATION_STEPS.field()
    """Default for ``Accelerator(gradient_accumulation_steps=)`` when the script does not pass one."""
    fsdp_config: FSDPOptions | None = None
    """FSDP options (``config/fsdp.py``); present exactly when distributed_type is FSDP."""
    main_training_function: str = Option(
        help="Accelerate's key (used by notebook launchers); accepted (another name is listed in unused_keys).",
        default="main", parse=lambda value, key, where: str(value or "main"), flag=False).field()
    downcast_bf16: bool = Option(
        help="Accelerate's TPU key; accepted (written as 'no'/'yes' like Accelerate; 'yes' is listed in unused_keys).",
        default=False, parse=boolean, flag=False).field()
    collective_timeout: float = COLLECTIVE_TIMEOUT.field()
    max_restarts: int = Option(help="Restart the whole worker group up to K times after a failure.", default=0,
                               parse=integer(0), flag_type=int, env=("PET_MAX_RESTARTS",)).field()
    """Restarts of the whole worker group after a failure (torchrun's --max-restarts)."""
    monitor_interval: float = Option(help="Seconds between checks of worker health.", default=0.1, parse=seconds,
                                     flag_type=float, env=("PET_MONITOR_INTERVAL",)).field()
    num_cpu_threads_per_process: int | None = Option(
        help="OMP_NUM_THREADS per worker (default: cores / processes per machine).", parse=optional(integer(1)),
        flag_type=int).field()
    deepspeed_config: dict[str, Any] | None = None
    """Accelerate's ``deepspeed_config`` block (zero_stage, offload_*, deepspeed_config_file, ...); present
    exactly when distributed_type is DEEPSPEED, and run on FSDP2/DDP (``trainkit.config.deepspeed``)."""
    dynamo_config: dict[str, Any] | None = None
    """torch.compile settings (``dynamo_backend``, ``dynamo_mode``, ``dynamo_use_fullgraph``,
    ``dynamo_use_dynamic``, ``dynamo_use_regional_compilation``); None compiles nothing."""
    parallelism_config: dict[str, Any] | None = None
    """Accelerate's ``parallelism_config:`` block (``parallelism_config_tp_size: 2``, ...): the run's data
    replicas x FSDP shards x tensor-parallel degrees; their product is ``num_processes``. None or empty: none."""
    preemption_signals: str = PREEMPTION_SIGNALS.field()
    """Signals the launcher forwards to every worker and the workers answer by saving a checkpoint and
    stopping (comma-separated names; a YAML list works too). See docs/preemption.md."""
    preemption_grace_period: int = PREEMPTION_GRACE_PERIOD.field()
    _parallelism: ParallelismConfig | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    """The ``parallelism_config:`` block parsed once (by :meth:`_finish_parallelism`), for :meth:`parallelism`."""
    precision_config: dict[str, dict[str, Any]] | None = None
    """The chosen mixed precision's own options block, ``{block: {option: value}}`` (e.g. ``fp8_config``), parsed
    by its declaration (``config/precision.py``); None when the mode declares no options or none were given.
    Written and read under the block's own key, never as ``precision_config``."""
    unused_keys: list[str] = dataclasses.field(default_factory=list)
    """Keys accepted but not acted on (Accelerate's deepspeed_config, tpu_*, ...), reported once."""
    provenance: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """Where each value came from: "default", a file path, "flag", ... (keys: field names and
    ``fsdp_config.fsdp_<option>``)."""

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        """The keys a config mapping may hold (besides Accelerate's unused ones)."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in _NOT_KEYS]

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
        parse_declared(self, lambda name: _where(self.provenance, name))  # each key by its own declaration
        self._finish_deepspeed()
        self.unused_keys.sort()  # one stable order for the notice, whichever section found them
        if self.dynamo_config is not None:
            if not isinstance(self.dynamo_config, Mapping):
                raise ConfigError(f"'dynamo_config' in {_where(self.provenance, 'dynamo_config')} must be a mapping, "
                                  f"got {self.dynamo_config!r}.")
            plugin = TorchDynamoPlugin.from_config(self.dynamo_config, where=_where(self.provenance, "dynamo_config"))
            self.dynamo_config = plugin.to_config() if plugin.enabled else None
        self._validate_machines()
        self._finish_parallelism()
        self._finish_precision_options()

    def _finish_precision_options(self) -> None:
        """Parse each precision options block given (a typo is a typo); keep the chosen mode's, list the others."""
        blocks, chosen = self.precision_config or {}, {}
        for block, values in blocks.items():
            mode, declaration = option_blocks()[block]
            options = declaration.read_options(values, where=f"{block} ({_where(self.provenance, 'precision_config')})")
            if mode == self.mixed_precision:
                chosen[block] = dataclasses.asdict(options)
            elif block not in self.unused_keys:
                self.unused_keys.append(block)
        self.precision_config = chosen or None

    def _finish_parallelism(self) -> None:
        """Check the ``parallelism_config:`` block now (keys, values, product = num_processes), in the launcher."""
        block = self.parallelism_config
        if block is not None and not isinstance(block, Mapping):
            raise ConfigError(f"'parallelism_config' in {_where(self.provenance, 'parallelism_config')} must be a "
                              f"mapping of parallelism_config_* keys, got {block!r}.")
        config = ParallelismConfig.from_mapping(
            block, where=f"parallelism_config ({_where(self.provenance, 'parallelism_config')})") if block else None
        self._parallelism = config
        if config is None:
            self.parallelism_config = None
            return
        config.resolved(self.num_processes)  # raises naming the degrees and the process count
        self.parallelism_config = config.to_launch_dict()

    def parallelism(self) -> ParallelismConfig | None:
        """The ``parallelism_config:`` block as a :class:`ParallelismConfig` (None when absent or empty), parsed once
        when the config was resolved."""
        return self._parallelism

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
        if self.min_machines is not None:
            where = _where(self.provenance, "min_machines")
            self.min_machines = to_int("min_machines", self.min_machines, where, minimum=1)
            if self.min_machines > self.num_machines:
                raise ConfigError(f"min_machines {self.min_machines} ({where}) is above num_machines "
                                  f"{self.num_machines} ({_where(self.provenance, 'num_machines')}).")
        if self.elastic and self.rdzv_backend != "c10d":
            backend_source = _where(self.provenance, "rdzv_backend")
            if backend_source != DEFAULT_SOURCE:
                raise ConfigError(f"rdzv_backend {self.rdzv_backend!r} ({backend_source}) cannot run an elastic job "
                                  f"(num_machines {self.machine_range}): machines join and leave only through the "
                                  "c10d rendezvous; use rdzv_backend c10d or a fixed num_machines.")
            self.rdzv_backend = "c10d"
            self.provenance["rdzv_backend"] = f"derived from num_machines {self.machine_range} (elastic)"
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
    def elastic(self) -> bool:
        """True when machines may leave and join (``min_machines`` below ``num_machines``)."""
        return self.min_machines is not None and self.min_machines < self.num_machines

    @property
    def machine_range(self) -> str:
        """torchrun's ``--nnodes`` value: ``"N"``, or ``"MIN:MAX"`` for an elastic job."""
        return f"{self.min_machines}:{self.num_machines}" if self.elastic else str(self.num_machines)

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
        result.update(self.precision_config or {})  # under each block's own key (fp8_config: ...)
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
        elif key == "parallelism_config" and isinstance(value, Mapping):
            merged["parallelism_config"] = {**(merged.get("parallelism_config") or {}), **value}  # key by key
            provenance["parallelism_config"] = source
        elif key == "dynamo_backend" or (key == "dynamo_config" and isinstance(value, Mapping)):
            block = {"dynamo_backend": value} if key == "dynamo_backend" else value
            merged["dynamo_config"] = {**(merged.get("dynamo_config") or {}), **block}  # merge key by key
            provenance["dynamo_config"] = source
        elif key == "num_machines" and isinstance(value, str) and ":" in value:
            minimum, maximum = parse_machine_range(value, source)
            merged["min_machines"], merged["num_machines"] = minimum, maximum
            provenance["min_machines"] = provenance["num_machines"] = source
        elif key in known:
            if key == "num_processes" and value in (None, -1):
                continue  # Accelerate's "not specified"
            if key == "num_machines" and "min_machines" not in mapping:
                merged.pop("min_machines", None)  # a plain count replaces a lower layer's MIN:MAX entirely
                provenance.pop("min_machines", None)
            merged[key] = value
            provenance[key] = source
        elif key in option_blocks():  # a mixed precision's own options (config/precision.py), key by key
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"'{key}' in {source} must be a mapping, got {value!r}.")
            blocks = merged.setdefault("precision_config", {})
            blocks[key] = {**blocks.get(key, {}), **value}
            provenance["precision_config"] = source
        elif key in UNUSED_ACCELERATE_KEYS:
            if key == "fp16" and to_bool("fp16", value, source) and "mixed_precision" not in mapping:
                merged["mixed_precision"] = "fp16"  # Accelerate's pre-mixed_precision spelling
                provenance["mixed_precision"] = source
            elif _asks_for_something(value) and key not in unused:
                unused.append(key)
        else:
            raise unknown_key_error(key, known, where=source)


def parse_machine_range(value: str, source: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (torchrun's ``--nnodes`` form) -> (MIN, MAX), or a ConfigError naming the value."""
    parts = str(value).split(":")
    if len(parts) != 2:
        raise ConfigError(f"Invalid value {value!r} for 'num_machines' in {source}: expected an integer "
                          "or MIN:MAX (an elastic job, e.g. 1:4).")
    try:
        minimum, maximum = (to_int("num_machines", part.strip(), source, minimum=1) for part in parts)
    except ConfigError:
        raise ConfigError(f"Invalid value {value!r} for 'num_machines' in {source}: MIN and MAX must be "
                          "integers >= 1 (e.g. 1:4).") from None
    if minimum > maximum:
        raise ConfigError(f"Invalid value {value!r} for 'num_machines' in {source}: MIN ({minimum}) is above "
                          f"MAX ({maximum}).")
    return minimum, maximum


def _parse_compute_environment(value: Any, where: str) -> str:
    if str(value).upper() == "AMAZON_SAGEMAKER":
        raise ConfigError(f"compute_environment 'AMAZON_SAGEMAKER' ({where}) is not supported by trainkit; "
                          "use LOCAL_MACHINE.")
    return check_choice("compute_environment", value, COMPUTE_ENVIRONMENTS, where=where)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else (str(value).strip() or None)


def _parse_port(value: Any, where: str) -> int | None:
    """A port 0-65535; 0 and None mean "pick one"."""
    if value is None:
        return None
    port = to_int("main_process_port", value, where, minimum=0)
    if port > 65535:
        raise ConfigError(f"Invalid value {port} for 'main_process_port' in {where}: ports run 0-65535.")
    return port or None


def _parse_rdzv_conf(value: Any, where: str) -> str | None:
    """``key=value,...`` text (a YAML mapping works too), checked for its shape; None when empty."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = ",".join(f"{key}={item}" for key, item in value.items())
    text = str(value).strip()
    for pair in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in pair or not pair.split("=", 1)[0].strip():
            raise ConfigError(f"Invalid value {value!r} for 'rdzv_conf' in {where}: expected key=value pairs "
                              "separated by commas (e.g. last_call_timeout=5,join_timeout=120).")
    return text or None


def _asks_for_something(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "no", "false", "none")
    return bool(value)


def _where(provenance: Mapping[str, str], key: str) -> str:
    return provenance.get(key, DEFAULT_SOURCE)
