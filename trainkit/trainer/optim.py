"""Optimizers named by TrainingArguments (``optim``, ``optim_args``) and their parameter groups.

Every ``optim`` name means what the installed transformers makes of it: torch's own optimizers with no
``optim_args`` (:data:`BUILT_WITH_TORCH`) are built here with transformers' keywords; every other name is resolved
by the handler table of transformers' public static ``Trainer.get_optimizer_cls_and_kwargs(args, model)``, so each
means what it means in that release (its ``optim_args`` keys, its packages, its defaults). Parameter groups follow
transformers' ``get_decay_parameter_names`` (no decay on biases and normalisation weights). What the resolution
cannot tell before a run is checked at construction (:func:`check_optimizer_name`): a name whose package is missing
is refused naming it, and a name that needs hardware this machine lacks says which. Schedules: schedules.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainkit.config.errors import ConfigError

logger = logging.getLogger(__name__)

# Names whose optimizer runs on one kind of hardware only, measured on a CPU-only machine with their packages
# installed (docs/trainer.md's optimizer table): construction refuses them elsewhere, saying what they need.
HARDWARE_ONLY: dict[str, tuple[str, Callable[[], bool]]] = {
    "adamw_torch_xla": ("a TPU (torch_xla)", lambda: _importable("torch_xla")),
    "adamw_torch_npu_fused": ("an Ascend NPU (torch_npu)", lambda: _importable("torch_npu")),
    "adalomo": ("a CUDA GPU (lomo-optim's AdaLomo allocates its state with .cuda())", torch.cuda.is_available),
    "galore_adamw_8bit": ("a CUDA GPU (galore-torch's 8-bit AdamW synchronises CUDA in its step)",
                          torch.cuda.is_available),
    "galore_adamw_8bit_layerwise": ("a CUDA GPU (galore-torch's 8-bit AdamW synchronises CUDA in its step)",
                                    torch.cuda.is_available),
}
LOMO_NAMES = ("lomo", "adalomo")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


BUILT_WITH_TORCH: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw_torch": (torch.optim.AdamW, {}),
    "adamw_torch_fused": (torch.optim.AdamW, {"fused": True}),
    "sgd": (torch.optim.SGD, {}),
    "adagrad": (torch.optim.Adagrad, {}),
    "rmsprop": (torch.optim.RMSprop, {}),
}
"""torch's own optimizers among the ``optim`` names, with what transformers adds to the learning rate (and to Adam's
betas and epsilon for AdamW) when ``optim_args`` is empty: resolved here, so a plain ``nn.Module`` run need not
import transformers (~0.3 s of start-up). Any other name, or any ``optim_args``, is resolved by transformers;
``tests/trainer/test_built_here.py`` compares these with transformers' resolution."""


def _built_with_torch(args: Any) -> tuple[Any, dict[str, Any]]:
    optimizer_cls, extra = BUILT_WITH_TORCH[args.optim]
    kwargs: dict[str, Any] = {"lr": args.learning_rate}
    if optimizer_cls is torch.optim.AdamW:
        kwargs.update(betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    return optimizer_cls, {**kwargs, **extra}


def optimizer_names() -> list[str]:
    """Every ``optim`` value the installed transformers defines (its ``OptimizerNames``)."""
    from transformers.training_args import OptimizerNames

    return [name.value for name in OptimizerNames]


class _ResolverArguments:
    """trainkit's arguments as transformers' resolver reads them: ``optim`` as its ``OptimizerNames`` member
    (its handlers are keyed by the enum), every other attribute read through."""

    def __init__(self, args: Any, optim_args: str | None) -> None:
        from transformers.training_args import OptimizerNames

        self._args = args
        self.optim = OptimizerNames(args.optim)
        self.optim_args = optim_args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._args, name)


def optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None,
                             optim_args: str | None | bool = True) -> tuple[Any, dict[str, Any]]:
    """transformers' ``Trainer.get_optimizer_cls_and_kwargs`` for trainkit's ``args`` (``optim_args=True``: the
    arguments' own; a string or None: that instead, used to find which keys a name reads)."""
    chosen_args = args.optim_args if optim_args is True else optim_args or None
    if args.optim in BUILT_WITH_TORCH and not chosen_args:
        optimizer_cls, kwargs = _built_with_torch(args)
    else:
        optimizer_cls, kwargs = _resolve(_ResolverArguments(args, chosen_args), model)
    if kwargs.get("fused") and "params" not in kwargs and model is not None and not _fused_supported(model):
        logger.info("Fused AdamW is not available for these parameters; using the foreach implementation.")
        kwargs = {key: value for key, value in kwargs.items() if key != "fused"}
    return optimizer_cls, kwargs


def _resolve(view: _ResolverArguments, model: nn.Module | None) -> tuple[Any, dict[str, Any]]:
    """transformers' resolution of ``view.optim``: the handler table ``Trainer.get_optimizer_cls_and_kwargs`` reads
    (``transformers.trainer_optimizer``, 5.17+), called with the context that method builds, so that resolving a
    name does not import ``transformers.trainer`` (the model code, DTensor, datasets and pandas it loads: ~1,600
    modules more than the table's ~550; ~700 fewer modules before a CNN script's first step). Older releases:
    the method itself.
    ``tests/trainer/test_optimizer_resolution.py`` compares the two for every name."""
    try:
        from transformers.trainer_optimizer import _OPTIMIZER_HANDLERS, OptimizerContext, _parse_optim_args
    except ImportError:
        from transformers import Trainer as TransformersTrainer

        return TransformersTrainer.get_optimizer_cls_and_kwargs(view, model)  # type: ignore[arg-type]  # a view standing in for transformers' TrainingArguments
    handler = _OPTIMIZER_HANDLERS.get(view.optim)
    if handler is None:
        raise ValueError(f"Trainer cannot instantiate unsupported optimizer: {view.optim}")
    context = OptimizerContext(args=view, model=model, optimizer_kwargs={"lr": view.learning_rate},  # type: ignore[arg-type]  # the view again
                               adam_kwargs={"betas": (view.adam_beta1, view.adam_beta2), "eps": view.adam_epsilon},
                               optim_args=_parse_optim_args(view.optim_args))
    return handler(context)


def check_optimizer_name(args: Any) -> None:
    """At construction: the name's package and hardware are here, and every ``optim_args`` key is read.

    Resolved without the model: names that need it (LOMO, GaLore, APOLLO) are finished by ``create_optimizer``.
    """
    name = args.optim
    if name in BUILT_WITH_TORCH and not args.optim_args:
        return  # torch's own optimizer: nothing to install, any hardware
    keys = _parsed_optim_args(args.optim_args)  # a malformed string fails here, before transformers' parser does
    if name in HARDWARE_ONLY:
        needs, present = HARDWARE_ONLY[name]
        if not present():
            raise ConfigError(f"optim={name!r} in TrainingArguments needs {needs}, which this machine does not have.")
    try:
        resolved = optimizer_cls_and_kwargs(args)
    except ImportError as error:  # transformers' message names the package (and how to install it)
        raise ConfigError(f"optim={name!r} in TrainingArguments needs a package that is not installed: {error}") from None
    except ValueError as error:
        message = str(error)
        if "model" in message:  # the name is fine; it needs the model, which create_optimizer passes
            return
        if "install" in message:  # transformers says so with a ValueError for some names (apex, torchdistx, ...)
            raise ConfigError(f"optim={name!r} in TrainingArguments needs a package that is not installed: "
                              f"{message}") from None
        raise ConfigError(f"optim={name!r} in TrainingArguments cannot be used here: {message}") from None
    unread = [key for key in keys
              if _same_resolution(resolved, optimizer_cls_and_kwargs(args, optim_args=_without(args.optim_args, key)))]
    if unread:
        logger.warning("optim_args keys %s are not read by optim=%r (transformers' resolution of that name ignores "
                       "them); they have no effect.", unread, name)


def _parsed_optim_args(optim_args: str | None) -> list[str]:
    if not optim_args:
        return []
    keys = []
    for pair in optim_args.replace(" ", "").split(","):
        if pair.count("=") != 1:
            raise ConfigError(f"optim_args={optim_args!r} in TrainingArguments: expected 'key=value,key=value'.")
        keys.append(pair.split("=", 1)[0])
    return keys


def _without(optim_args: str, key: str) -> str:
    return ",".join(pair for pair in optim_args.replace(" ", "").split(",") if pair.split("=", 1)[0] != key)


def _same_resolution(first: tuple[Any, dict[str, Any]], second: tuple[Any, dict[str, Any]]) -> bool:
    return first[0] is second[0] and first[1] == second[1]


NO_DECAY_NAME_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
"""Parameter names ``Trainer.get_decay_parameter_names`` excludes from weight decay (besides ``nn.LayerNorm``
weights); ``tests/trainer/test_optimizer_resolution.py`` compares the rule with that method's answers."""


def decay_parameter_names(model: nn.Module) -> list[str]:
    """transformers' rule (its ``Trainer.get_decay_parameter_names``), in its order: every parameter name but those
    inside an ``nn.LayerNorm`` below the top module and those whose lower-cased name, read from any module on the way
    down, says bias or norm (layernorm, rmsnorm, .norm, _norm); registered ``None`` parameters are named too."""
    patterns = [re.compile(pattern) for pattern in NO_DECAY_NAME_PATTERNS]

    def decayed(name: str) -> bool:
        return not any(pattern.search(name.lower()) for pattern in patterns)

    def names_in(module: nn.Module) -> list[str]:
        names = []
        for child_name, child in module.named_children():
            if not isinstance(child, nn.LayerNorm):
                names += [f"{child_name}.{name}" for name in names_in(child) if decayed(f"{child_name}.{name}")]
        return names + [name for name in module._parameters if decayed(name)]

    return names_in(model)


def parameter_groups(model: nn.Module, decay_names: list[str] | set[str], weight_decay: float) -> list[dict[str, Any]]:
    """transformers' two groups of trainable parameters, with and without ``weight_decay`` (kept when empty, so
    optimizer states have transformers' layout)."""
    decayed = set(decay_names)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for name, p in named if name in decayed], "weight_decay": weight_decay},
            {"params": [p for name, p in named if name not in decayed], "weight_decay": 0.0}]


def instantiate_optimizer(optimizer_cls: Any, kwargs: dict[str, Any], groups: list[dict[str, Any]],
                          model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer as transformers' ``create_optimizer`` does: a factory (Muon, Dion) is called with the
    model; otherwise the class gets the groups, or what the resolver put in their place (GaLore/APOLLO's
    ``params``, LOMO's ``model``, the layer-wise ``optimizer_dict``)."""
    kwargs = dict(kwargs)
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        return optimizer_cls()(model, **kwargs)
    target: Any = groups
    for replacement in ("params", "model", "optimizer_dict"):
        if replacement in kwargs:
            target = kwargs.pop(replacement)
    return optimizer_cls(target, **kwargs)


def create_optimizer(trainer: Any, model: nn.Module) -> torch.optim.Optimizer:
    """``Trainer.create_optimizer``'s body: ``optimizer_cls_and_kwargs`` > a DeepSpeed config's optimizer >
    ``trainer.get_optimizer_cls_and_kwargs(args, model)``, over transformers' decay groups of ``model``."""
    from .training_arguments.deepspeed import optimizer_from_config

    args = trainer.args
    groups = parameter_groups(model, trainer.get_decay_parameter_names(model), args.weight_decay)
    if trainer.optimizer_cls_and_kwargs is not None:
        optimizer_cls, kwargs = trainer.optimizer_cls_and_kwargs
    else:
        from_config = optimizer_from_config(trainer._deepspeed, [g for g in groups if g["params"]], args)
        if from_config is not None:
            return from_config
        optimizer_cls, kwargs = trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = instantiate_optimizer(optimizer_cls, kwargs, groups, model)
    if "bitsandbytes" in str(optimizer_cls) and kwargs.get("optim_bits") == 8:
        _embeddings_in_32_bits(model)
    return optimizer


def _embeddings_in_32_bits(model: nn.Module) -> None:
    # As transformers does for 8-bit bitsandbytes optimizers: embeddings keep 32-bit optimizer states.
    import importlib

    manager = importlib.import_module("bitsandbytes").optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})


def optimizer_group(trainer: Any, param: str | nn.Parameter | None = None):
    """transformers' ``get_optimizer_group``: the param group holding ``param`` (a parameter, or its name in the
    Trainer's model), else every group's parameters. Matched by identity: transformers' ``param in params``
    compares tensors by value, which raises for any parameter but a group's first."""
    if trainer.optimizer is None:
        raise ValueError("get_optimizer_group() needs the optimizer: call create_optimizer() first.")
    if isinstance(param, str):
        param = dict(trainer.model.named_parameters()).get(param)
    if param is not None:
        for group in trainer.optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group
    return [group["params"] for group in trainer.optimizer.param_groups]


def backward_kwargs(optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """What ``Accelerator.backward`` needs besides the loss: a LOMO optimizer steps inside backward, at the
    schedule's current rate (as transformers passes it); nothing for every other optimizer."""
    if not is_lomo(optimizer):
        return {}
    from .meter import current_learning_rate

    return {"learning_rate": current_learning_rate(scheduler, optimizer)}


def _fused_supported(model: nn.Module) -> bool:
    # Fused AdamW runs on CPU and accelerator floating-point tensors (torch >= 2.4); DTensor shards are fine too.
    return all(p.device.type in ("cpu", "cuda", "xpu", "mps") and p.is_floating_point()
               for p in model.parameters() if p.requires_grad)


def is_lomo(optimizer: Any) -> bool:
    """A LOMO optimizer (``lomo``/``adalomo``): it updates the weights inside backward (``fused_backward``)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return callable(getattr(inner, "fused_backward", None))
