"""Small general helpers of ``accelerate.utils`` (dictionaries, names, sizes, ports, PEFT and TP models)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import Any


def merge_dicts(source: dict, destination: dict) -> dict:
    """Copy ``source`` into ``destination`` recursively (nested dicts are merged, other values replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``."""
    return functools.reduce(getattr, attr.split("."), obj)


def get_pretty_name(obj: Any) -> str:
    """A readable name: the qualified name of a class or function, else of the object's class."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree a transformers model was loaded with (``from_pretrained(tp_plan=...)`` or
    ``distributed_config``), or None: ``model.tp_size`` (transformers 4.x), else the config's
    ``distributed_config.tp_size`` (5.x; a dict after a JSON round trip)."""
    if getattr(model, "tp_size", None) is not None:
        return int(model.tp_size)
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    size = distributed.get("tp_size") if isinstance(distributed, dict) else getattr(distributed, "tp_size", None)
    return None if size is None else int(size)


def convert_bytes(size: float) -> str:
    """``size`` in bytes written in the largest unit under 1024 ("3.5 MB")."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def is_port_in_use(port: int | None = None) -> bool:
    """True when something listens on ``localhost:port`` (default 29500, the launcher's port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", 29500 if port is None else port)) == 0


def is_peft_model(model: Any) -> bool:
    """True for a PEFT-wrapped model (``peft.PeftModel``), when peft is installed."""
    from trainkit.utils.imports import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def deepspeed_required(func: Callable) -> Callable:
    """Decorator for functions that only make sense for a run with a DeepSpeed config."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from trainkit.engine.process.state import ProcessState
        from trainkit.utils.enums import DistributedType

        if ProcessState.get().distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(f"{func.__name__} needs a DeepSpeed config: pass deepspeed_plugin=DeepSpeedPlugin(...) "
                             "to the Accelerator (or launch with a DeepSpeed config).")
        return func(*args, **kwargs)

    return wrapper


def compile_regions(module: Any, **compile_kwargs: Any) -> Any:
    """Compile each instance of ``module``'s repeated block class in place (the whole module when it has none)
    with ``torch.compile``'s keyword arguments; returns ``module``."""
    from trainkit.engine.step.compile import repeated_blocks

    blocks = repeated_blocks(module)
    for block in blocks or [module]:
        block.compile(**compile_kwargs)
    return module


def compile_regions_deepspeed(module: Any, **compile_kwargs: Any) -> None:
    """:func:`compile_regions` for the module of a run with a DeepSpeed config (trainkit's is a plain module)."""
    compile_regions(module, **compile_kwargs)


def __getattr__(name: str) -> Any:
    # accelerate.utils.other also holds extract_model_from_parallel; here it loads the engine on first use.
    if name == "extract_model_from_parallel":
        from trainkit.utils.operations import extract_model_from_parallel

        return extract_model_from_parallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
