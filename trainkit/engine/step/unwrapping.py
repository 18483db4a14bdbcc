"""Taking a prepared model apart again: the user's module inside DDP / DataParallel / torch.compile wrappers.

One function serves ``Accelerator.unwrap_model`` and ``trainkit.utils.extract_model_from_parallel``, with
Accelerate's options: ``keep_fp32_wrapper=False`` restores the forward that mixed precision replaced, and
``keep_torch_compile`` decides whether a ``torch.compile`` wrapper (``OptimizedModule``) comes back around
the unwrapped module or is dropped. trainkit's own compilation is in place (no wrapper), so the option only
matters for a model the script compiled itself (``torch.compile``, or ``compile_regions``' twin, which keeps its
original under ``_orig_mod``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_PARALLEL_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def is_compiled_module(module: nn.Module) -> bool:
    """True for the wrapper ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    import torch._dynamo

    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def has_compiled_regions(module: nn.Module) -> bool:
    """True when a submodule is a ``torch.compile`` wrapper (regional compilation by the script)."""
    return any(is_compiled_module(child) for child in module.modules() if child is not module)


def _compiled_inner(compiled: nn.Module) -> nn.Module:
    inner = compiled._orig_mod
    assert isinstance(inner, nn.Module)
    return inner


def _strip_parallel(model: nn.Module, strategy_unwrap: Callable[[nn.Module], nn.Module] | None) -> nn.Module:
    if strategy_unwrap is not None:
        model = strategy_unwrap(model)
    while isinstance(model, _PARALLEL_WRAPPERS):
        model = model.module
    return model


def _unwrap_children(module: nn.Module) -> nn.Module:
    """``recursive=True``: replace wrapped submodules by the modules they wrap, all the way down."""
    inner = module.module if isinstance(module, _PARALLEL_WRAPPERS) else module
    for name, child in list(inner.named_children()):
        setattr(inner, name, _unwrap_children(child))
    return inner


def extract_model(model: nn.Module, *, keep_fp32_wrapper: bool = True, keep_torch_compile: bool | None = None,
                  recursive: bool = False,
                  strategy_unwrap: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
    """The user's module inside ``model``'s wrappers.

    ``keep_torch_compile`` truthy: a compile wrapper (outside or inside the parallel wrapper) is returned around
    the unwrapped module; falsy (None included, Accelerate's ``unwrap_model`` default): the bare module.
    """
    compiled: nn.Module | None = None
    if is_compiled_module(model):
        compiled, model = model, _compiled_inner(model)
    elif isinstance(model.__dict__.get("_orig_mod"), nn.Module) and has_compiled_regions(model):
        compiled, model = model, model.__dict__["_orig_mod"]  # compile_regions' twin: the module it was made from
    model = _strip_parallel(model, strategy_unwrap)
    if compiled is None and is_compiled_module(model):  # the script compiled before prepare
        compiled, model = model, _strip_parallel(_compiled_inner(model), strategy_unwrap)
    if recursive:
        model = _unwrap_children(model)
    if not keep_fp32_wrapper:
        _restore_forward(model)
    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        return compiled
    return model


def _restore_forward(model: nn.Module) -> None:
    """Undo a replaced forward: trainkit's (``_trainkit_original_forward``) or one a script or library stored under
    Accelerate's name (``_original_forward``, e.g. before ``convert_outputs_to_fp32``)."""
    for attribute in ("_trainkit_original_forward", "_original_forward"):
        if attribute in model.__dict__:
            original = model.__dict__.pop(attribute)
            if getattr(original, "__self__", None) is model and getattr(original, "__func__", None) is \
                    getattr(type(model).forward, "__func__", type(model).forward):
                model.__dict__.pop("forward", None)  # the class's own forward again: nothing bound is left behind
            else:
                model.forward = original
            return
