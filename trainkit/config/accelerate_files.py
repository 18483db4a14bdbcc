"""Accelerate's config files as written: ``BaseConfig``, ``ClusterConfig`` and ``SageMakerConfig`` (plain data).

:class:`~trainkit.config.launch.LaunchConfig` is what ``trainkit launch`` resolves and acts on (layers, provenance,
validation of every value). These classes are the other view, the file itself, key for key, for the commands that
read or rewrite a file without launching (``trainkit tpu-config`` reads its ``tpu_*``/``commands`` keys,
``trainkit to-fsdp2`` rewrites its ``fsdp_config``) and for code written against
``accelerate.commands.config.config_args``. A key neither class declares is a :class:`ConfigError` (a ValueError,
as in Accelerate) naming it; blocks (``fsdp_config``...) are kept as the mappings the file holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError, check_choice, unknown_key_error
from .files import default_config_path, read_mapping_file, write_config_file
from .values import DISTRIBUTED_TYPES, UNSUPPORTED_DISTRIBUTED_TYPES

LOCAL_MACHINE = "LOCAL_MACHINE"
AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"
_SAGEMAKER_DISTRIBUTED_TYPES = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")


@dataclasses.dataclass
class BaseConfig:
    """The keys every Accelerate config file has; ``to_dict``/``to_yaml_file``/``to_json_file`` write them back."""

    compute_environment: str
    distributed_type: str
    mixed_precision: str | None
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        self.compute_environment = check_choice("compute_environment", _text(self.compute_environment),
                                                (LOCAL_MACHINE, AMAZON_SAGEMAKER), where="config")
        sagemaker = self.compute_environment == AMAZON_SAGEMAKER
        choices = _SAGEMAKER_DISTRIBUTED_TYPES if sagemaker else DISTRIBUTED_TYPES + UNSUPPORTED_DISTRIBUTED_TYPES
        self.distributed_type = check_choice("distributed_type", _text(self.distributed_type), choices, where="config")
        if getattr(self, "dynamo_config", {}) is None:  # both subclasses declare it
            setattr(self, "dynamo_config", {})

    def to_dict(self) -> dict[str, Any]:
        """The file's mapping: keys with a value (None and empty blocks are left out, as Accelerate writes)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None and value != {}}

    @classmethod
    def from_mapping(cls, mapping: dict[str, Any], *, where: str = "config") -> BaseConfig:
        """Build from a file's mapping: older spellings updated (``fp16``, ``dynamo_backend``), unknown keys refused."""
        return cls(**_checked(cls, mapping, where))

    @classmethod
    def from_yaml_file(cls, yaml_file: str | os.PathLike[str] | None = None) -> BaseConfig:
        """Read a YAML file (default: trainkit's default config file)."""
        path = default_config_path() if yaml_file is None else yaml_file
        return cls.from_mapping(read_mapping_file(path), where=str(path))

    from_json_file = from_yaml_file  # read_mapping_file tells JSON from YAML by the suffix

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the file (atomic, see :func:`~trainkit.config.files.write_config_file`)."""
        write_config_file(self.to_dict(), yaml_file)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the file as JSON, whatever its suffix."""
        Path(json_file).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclasses.dataclass
class ClusterConfig(BaseConfig):
    """A LOCAL_MACHINE file: one or many machines (what ``trainkit launch`` reads), TPU-pod keys included."""

    num_processes: int = -1
    """-1: not given (a cluster scheduler decides)."""
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] | None = None
    deepspeed_config: dict[str, Any] | None = None
    fsdp_config: dict[str, Any] | None = None
    parallelism_config: dict[str, Any] | None = None
    megatron_lm_config: dict[str, Any] | None = None
    mpirun_config: dict[str, Any] | None = None
    downcast_bf16: bool | str = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    """A file of shell commands, one a line, that ``trainkit tpu-config`` runs on every TPU VM."""
    commands: list[str] | None = None
    """Shell commands ``trainkit tpu-config`` runs on every TPU VM (when no command file is given)."""
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for block in ("fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config",
                      "mpirun_config"):
            if getattr(self, block) is None:
                setattr(self, block, {})
        super().__post_init__()


@dataclasses.dataclass
class SageMakerConfig(BaseConfig):
    """An AMAZON_SAGEMAKER file, read and written as data (``trainkit launch`` does not launch on SageMaker)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str | None = None
    pytorch_version: str | None = None
    transformers_version: str | None = None
    py_version: str | None = None
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict[str, Any] | None = None
    dynamo_config: dict[str, Any] | None = None
    enable_cpu_affinity: bool = False


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> ClusterConfig | SageMakerConfig:
    """The file as a :class:`ClusterConfig` (LOCAL_MACHINE) or :class:`SageMakerConfig`.

    ``None`` reads trainkit's default config file. A missing file is a ``FileNotFoundError`` naming it.
    """
    path = default_config_path() if config_file is None else Path(config_file).expanduser()
    if not Path(path).is_file():
        raise FileNotFoundError(f"Config file {str(path)!r} does not exist (write one with `trainkit config`).")
    mapping = read_mapping_file(path)
    sagemaker = _text(mapping.get("compute_environment", LOCAL_MACHINE)).upper() == AMAZON_SAGEMAKER
    if sagemaker:
        return SageMakerConfig(**_checked(SageMakerConfig, mapping, str(path)))
    return ClusterConfig(**_checked(ClusterConfig, mapping, str(path)))


def _checked(cls: type[BaseConfig], mapping: dict[str, Any], where: str) -> dict[str, Any]:
    """``mapping`` with :func:`_with_defaults` applied; a key ``cls`` does not declare is a ConfigError naming it."""
    known = {field.name for field in dataclasses.fields(cls)}
    values = _with_defaults(dict(mapping), where)
    if "num_processes" in known and _text(values["distributed_type"]) == "NO":
        values.setdefault("num_processes", 1)
    for key in sorted(set(values) - known):
        raise unknown_key_error(key, known, where=where)
    return values


def _with_defaults(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Fill the keys older files lack and update their older spellings, as Accelerate reads them."""
    values.setdefault("compute_environment", LOCAL_MACHINE)
    if "distributed_type" not in values:
        raise ConfigError(f"{where} has no 'distributed_type' (one of {', '.join(DISTRIBUTED_TYPES)}).")
    fp16 = values.pop("fp16", None)
    values.setdefault("mixed_precision", "fp16" if fp16 else None)
    if "dynamo_backend" in values:
        backend = values.pop("dynamo_backend")
        values["dynamo_config"] = {} if _text(backend).upper() == "NO" else {"dynamo_backend": backend}
    for flag in ("use_cpu", "debug", "enable_cpu_affinity"):
        values.setdefault(flag, False)
    return values


def _text(value: Any) -> str:
    """A file's value as text; YAML reads an unquoted ``NO`` as False, which means the string here."""
    return "NO" if value is False else str(value)
