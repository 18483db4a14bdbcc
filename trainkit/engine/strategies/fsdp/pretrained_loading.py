"""``cpu_ram_efficient_loading`` before ``prepare``: only rank 0 reads weights in ``from_pretrained``.

Under the option, FSDP fills every rank's shards from rank 0's weights (:mod:`trainkit.engine.strategies.fsdp.rank0_weights`),
so the other ranks need the model's structure only. transformers 5 no longer skips loading on those
ranks: it memory-maps safetensors everywhere, which costs nothing until a page is read, but a dtype
conversion at load (``dtype=torch.bfloat16`` over an fp32 checkpoint) materialises the whole model on
every rank (measured: 1,089 MiB peak on rank 1 for GPT-2 small in bf16, against 355 MiB without
reading). On ranks other than 0, :func:`load_on_rank0_only` therefore makes ``from_pretrained`` calls
without a ``device_map`` build the model on the meta device, as Accelerate's users get from
transformers 4 under the same option; buffers and weights arrive at ``prepare``. The model is built from
its configuration (resolved by transformers as ``from_pretrained`` would) with ``_from_config`` under a meta
device: ``from_pretrained(device_map="meta")`` would need the ``accelerate`` package, which trainkit's users
need not have (transformers 5.x raises without it).

Called wherever the option is resolved before a script can load a model: the FSDP plugin, the FSDP
strategy (any ``Accelerator`` source, a DeepSpeed ``zero3_init_flag`` included), the Trainer's
``TrainingArguments`` and the ``trainkit launch`` worker bootstrap. The first FSDP ``prepare``
with the option calls :func:`restore_from_pretrained`, so models loaded afterwards (an evaluation reload
of the saved weights) are real on every rank again.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

TRANSFORMERS_FLAGS = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
"""transformers' own switches for the option (non-persistent buffers on ranks other than local rank 0)."""

_original_from_pretrained: Any = None
"""transformers' own ``PreTrainedModel.from_pretrained`` function while this module replaces it."""

_flags_before: dict[str, str | None] | None = None
"""The values :data:`TRANSFORMERS_FLAGS` had before this module set them (``None``: unset), while set."""


def load_on_rank0_only() -> bool:
    """Set transformers' flags and, on ranks other than 0 of a multi-process job, load on meta.

    Returns whether ``from_pretrained`` now builds on the meta device in this process. Calls that pass
    a ``device_map`` or a ``quantization_config`` are left alone. Idempotent.
    """
    global _original_from_pretrained, _flags_before
    if _flags_before is None:
        _flags_before = {name: os.environ.get(name) for name in TRANSFORMERS_FLAGS}
    os.environ.update(TRANSFORMERS_FLAGS)
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or int(os.environ.get("RANK", "0")) == 0:
        return False
    try:
        from transformers import modeling_utils
    except ImportError:  # no transformers: nothing loads through from_pretrained
        return False
    if _original_from_pretrained is not None:
        return True
    original = _original_from_pretrained = modeling_utils.PreTrainedModel.__dict__["from_pretrained"].__func__

    @functools.wraps(original)
    def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_map") is not None or kwargs.get("quantization_config") is not None or not args:
            return original(cls, *args, **kwargs)
        logger.info("cpu_ram_efficient_loading: rank %s builds %s on the meta device; prepare() fills it "
                    "from rank 0.", os.environ.get("RANK"), cls.__name__)
        return _empty_model(cls, args[0], kwargs)

    pretrained: Any = modeling_utils.PreTrainedModel  # Any: mypy refuses assigning to a method
    pretrained.from_pretrained = classmethod(from_pretrained)
    return True


HUB_OPTIONS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies",
               "trust_remote_code")
"""``from_pretrained`` keywords that say where the configuration comes from; passed on to the config's loader."""


def _empty_model(cls: Any, location: Any, kwargs: dict[str, Any]) -> Any:
    """``cls`` with the configuration ``from_pretrained(location, **kwargs)`` would use, on the meta device.

    Configuration keywords (``num_labels=2``) update the configuration as ``from_pretrained`` does; keywords
    about reading weights have nothing to act on here and are dropped. In eval mode, as ``from_pretrained``
    returns models.
    """
    import torch
    from transformers import PretrainedConfig

    options = dict(kwargs)
    dtype = options.pop("dtype", options.pop("torch_dtype", None))
    attention = options.pop("attn_implementation", None)
    config = options.pop("config", None)
    hub = {key: options.pop(key) for key in HUB_OPTIONS if key in options}
    if isinstance(config, PretrainedConfig):
        config = copy.deepcopy(config)  # the caller's object stays as it was, as from_pretrained keeps it
        for key, value in options.items():
            if hasattr(config, key):
                setattr(config, key, value)
    else:
        config = cls.config_class.from_pretrained(config if config is not None else location, **hub, **options)
    if dtype == "auto":
        dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    extra = {"attn_implementation": attention} if attention is not None else {}
    with torch.device("meta"):
        model = cls._from_config(config, dtype=dtype, **extra)
    return model.eval()


def restore_from_pretrained() -> None:
    """Undo :func:`load_on_rank0_only` in this process: transformers' flags as they were (left set, transformers
    fills parameters with zeros on ranks other than 0 in later loads, expecting FSDP to broadcast them) and its
    ``from_pretrained``. A no-op when nothing was changed."""
    global _original_from_pretrained, _flags_before
    if _flags_before is not None:
        for name, value in _flags_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _flags_before = None
    if _original_from_pretrained is None:
        return
    from transformers import modeling_utils

    pretrained: Any = modeling_utils.PreTrainedModel
    pretrained.from_pretrained = classmethod(_original_from_pretrained)
    _original_from_pretrained = None
