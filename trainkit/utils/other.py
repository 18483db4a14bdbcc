"""Small general helpers of ``accelerate.utils`` (dictionaries, names, sizes, ports, PEFT and TP models)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from types import MethodType
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
    """Regional compilation as Accelerate's: a twin of ``module`` whose repeated blocks (each ``ModuleList`` whose
    children share one class) are ``torch.compile`` wrappers, with ``torch.compile``'s keyword arguments; a module
    without such a list comes back whole as one wrapper.

    The twin is a shallow copy at every level down to the blocks: it shares the parameters and buffers, keeps
    the original under ``_orig_mod`` (what :func:`extract_model_from_parallel` returns), and methods bound to
    an original module (a wrapped ``forward``) are bound to its twin, so attributes set on the twin stay on it.
    The original is left uncompiled. The Accelerator's own regional compilation (``TorchDynamoPlugin``) compiles
    in place instead, keeping parameter names; see trainkit/engine/step/compile.py.
    """
    twin = _compiled_twin(module, compile_kwargs)
    if "_orig_mod" not in twin.__dict__:
        twin.__dict__["_orig_mod"] = module
    return twin


def _is_block_list(module: Any) -> bool:
    import torch

    return (isinstance(module, torch.nn.ModuleList) and len(module) > 0
            and all(isinstance(child, type(module[0])) for child in module))


def _compiled_twin(module: Any, compile_kwargs: dict[str, Any]) -> Any:
    import torch

    if _is_block_list(module):
        compiled: list[Any] = [torch.compile(block, **compile_kwargs) for block in module]  # OptimizedModules
        return torch.nn.ModuleList(compiled)
    if not module._modules or not any(_is_block_list(inner) for inner in module.modules()):
        return torch.compile(module, **compile_kwargs)
    module_class: Any = type(module)
    twin = module_class.__new__(module_class)  # no __init__: the twin takes the original's state below
    twin.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():
        if hasattr(value, "__func__") and getattr(value, "__self__", None) is module:
            twin.__dict__[name] = MethodType(value.__func__, twin)  # e.g. a wrapped forward: it runs on the twin
    twin.__dict__["_modules"] = {name: _compiled_twin(child, compile_kwargs) for name, child in module.named_children()}
    return twin


def compile_regions_deepspeed(module: Any, **compile_kwargs: Any) -> None:
    """Regional compilation in place, as Accelerate's for a DeepSpeed engine's module: each repeated block (or the
    whole module, when it has none) is compiled with ``nn.Module.compile``; nothing is returned."""
    if _is_block_list(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif module._modules and any(_is_block_list(inner) for inner in module.modules()):
        for child in module.children():
            compile_regions_deepspeed(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def __getattr__(name: str) -> Any:
    # accelerate.utils.other also holds extract_model_from_parallel; here it loads the engine on first use.
    if name == "extract_model_from_parallel":
        from trainkit.utils.operations import extract_model_from_parallel

        return extract_model_from_parallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
