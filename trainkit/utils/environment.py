"""Reading and patching environment variables, as ``accelerate.utils`` offers it to scripts and tests.

Plain Python: importing this module loads neither torch nor the engine.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1/0 (``True``/``False`` with ``to_bool``) for a spelling of yes or no; anything else is an error."""
    lowered = value.lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: use one of {_TRUE + _FALSE}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The yes/no value of environment variable ``key`` (``default`` when unset)."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The value of environment variable ``key`` as a string (``default`` when unset)."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first non-negative integer among the environment variables ``env_keys``, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each ``NAME=value`` (names upper-cased) for the block, then restore what was there."""
    previous = {key.upper(): os.environ.get(key.upper()) for key in kwargs}
    for key, value in kwargs.items():
        os.environ[key.upper()] = str(value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; afterwards the environment is exactly as before."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    prefix = "ACCELERATE_"
    saved = {key: value for key, value in os.environ.items() if key.startswith(prefix)}
    try:
        yield
    finally:
        for key in [key for key in os.environ if key.startswith(prefix)]:
            del os.environ[key]
        os.environ.update(saved)


def purge_accelerate_environment(func_or_cls: Callable | type) -> Callable | type:
    """Decorator for a function or a (test) class: ``ACCELERATE_*`` variables it sets are undone afterwards
    (for a class: around each of its and its subclasses' ``test*`` methods and ``setUp``/``tearDown``)."""
    def wrap(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _accelerate_variables_restored():
                return function(*args, **kwargs)

        return wrapper

    if not isinstance(func_or_cls, type):
        return wrap(func_or_cls)
    decorated = func_or_cls

    def wrap_members(cls: type) -> None:
        for name, member in list(vars(cls).items()):
            if callable(member) and (name.startswith("test") or name in ("setUp", "tearDown")):
                setattr(cls, name, wrap(member))

    def init_subclass(subclass: type, **kwargs: Any) -> None:
        super(decorated, subclass).__init_subclass__(**kwargs)  # type: ignore[misc, arg-type]  # a hook on a decorated class
        wrap_members(subclass)  # the tests a subclass defines are covered too

    wrap_members(decorated)
    decorated.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]  # replacing the class hook
    return decorated


def convert_dict_to_env_variables(current_env: dict) -> list[str]:
    """``KEY=value\\n`` lines for an environment file; pairs with an empty side or a character that would
    break the file (``;``, newline, ``<``, ``>``, space) are left out with a warning."""
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in (";", "\n", "<", ">", " ")):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning("Skipping %s=%s: it is empty or contains a forbidden character.", key, value)
    return lines


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """("cuda", "MULTI_GPU") where CUDA is available, else ("cpu", "MULTI_CPU"): the devices trainkit drives."""
    import torch

    return ("cuda", "MULTI_GPU") if torch.cuda.is_available() else ("cpu", "MULTI_CPU")


def check_os_kernel() -> None:
    """Warn on Linux kernels older than 5.5, which can hang multi-process runs."""
    import platform

    if platform.system() != "Linux":
        return
    release = platform.release().split("-")[0].split(".")
    try:
        version = tuple(int(part) for part in release[:2])
    except ValueError:
        return
    if version < (5, 5):
        # Formatted here, not by logging: the message itself names both versions (tests read record.msg).
        logger.warning(f"Linux kernel {platform.release()} is older than 5.5.0, the minimum recommended: processes "
                       "may hang.")


class CPUInformation(NamedTuple):
    """This process's place in a multi-process CPU job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def get_cpu_distributed_information() -> CPUInformation:
    """Rank, world size, local rank and local world size from torchrun's or an MPI launcher's variables."""
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "MV2_COMM_WORLD_LOCAL_SIZE"], 1))


def get_gpu_info() -> tuple[list[str], int]:
    """(names, count) of the NVIDIA GPUs ``nvidia-smi`` lists, without initialising CUDA; ([], 0) without it."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], 0
    output = subprocess.check_output([smi, "--query-gpu=name", "--format=csv,noheader"], text=True).strip()
    names = [line.strip() for line in output.splitlines() if line.strip()]
    return names, len(names)


def check_cuda_p2p_ib_support() -> bool:
    """False when several consumer RTX 40xx GPUs are present (their peer-to-peer/InfiniBand paths hang NCCL
    with older drivers; set NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 there), else True."""
    names, count = get_gpu_info()
    return not (count > 1 and any("RTX 40" in name for name in names))


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """The fp16 loss scaler for the run: FSDP's sharded scaler for FSDP, else torch's for CUDA or CPU."""
    import torch

    if str(getattr(distributed_type, "value", distributed_type)) == "FSDP":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    return torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu", **kwargs)
