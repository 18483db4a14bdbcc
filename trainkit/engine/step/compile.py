"""Compiling prepared models with torch.compile, in place: whole model, or one repeated block at a time.

Compilation uses ``nn.Module.compile`` (in place) rather than ``torch.compile(module)`` (a wrapper), so
the model keeps its class, its attributes and its parameter names: state dicts and checkpoints never
carry ``_orig_mod.`` prefixes, and FSDP2 / DDP wrap the same module they would wrap uncompiled.

Regional compilation compiles every instance of the model's repeated block class (transformers models
name it in ``_no_split_modules``; otherwise the class repeated in a ``ModuleList``). The instances share
one forward function, so dynamo compiles it once and reuses the code for the other instances: cold
start costs one block instead of the whole model. The strategy calls :func:`compile_model` before it
shards or wraps, as torchtitan does for FSDP2: each block's graph then holds the block's compute, and
FSDP2's all-gather and reshard hooks run around it.
"""

from __future__ import annotations

import logging

from torch import nn

from trainkit.config.dynamo import TorchDynamoPlugin
from trainkit.config.errors import invalid_value_error

logger = logging.getLogger(__name__)


def check_backend(plugin: TorchDynamoPlugin) -> None:
    """Refuse a backend torch does not have, naming the ones it has."""
    if not plugin.enabled:
        return
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=()))
    if plugin.backend not in known:
        raise invalid_value_error("dynamo_backend", plugin.backend, ["no", *sorted(known)],
                                  where="Accelerator(dynamo_backend=...) / dynamo_config")


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The instances of the model's repeated block class (see module doc); empty when it has none."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if names:
        found = [module for module in model.modules() if type(module).__name__ in names]
        if len(found) > 1:
            return found
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                return list(module)
    return []


def compile_model(model: nn.Module, plugin: TorchDynamoPlugin) -> nn.Module:
    """Compile ``model`` in place as ``plugin`` says and return it (unchanged when compilation is off)."""
    if not plugin.enabled:
        return model
    kwargs = plugin.compile_kwargs()
    if plugin.use_regional_compilation:
        blocks = repeated_blocks(model)
        if blocks:
            for block in blocks:
                block.compile(**kwargs)
            logger.info("torch.compile (%s): %d x %s, regionally", plugin.backend, len(blocks),
                        type(blocks[0]).__name__)
            return model
        logger.warning("use_regional_compilation: %s has no repeated block class; compiling the whole model.",
                       type(model).__name__)
    model.compile(**kwargs)
    logger.info("torch.compile (%s): whole %s", plugin.backend, type(model).__name__)
    return model

