"""``cpu_ram_efficient_loading`` before ``prepare``: only rank 0 reads weights in ``from_pretrained``.

Under the option, FSDP fills every rank's shards from rank 0's weights (:mod:`trainkit.engine.strategies.fsdp.rank0_weights`),
so the other ranks need the model's structure only. transformers 5 no longer skips loading on those
ranks: it memory-maps safetensors everywhere, which costs nothing until a page is read, but a dtype
conversion at load (``dtype=torch.bfloat16`` over an fp32 checkpoint) materialises the whole model on
every rank (measured: 1,089 MiB peak on rank 1 for GPT-2 small in bf16, against 355 MiB without
reading). On ranks other than 0, :func:`load_on_rank0_only` therefore makes ``from_pretrained`` calls
without a ``device_map`` build the model on the meta device, as Accelerate's users get from
transformers 4 under the same option; buffers and weights arrive at ``prepare``.

Called wherever the option is resolved before a script can load a model: the FSDP plugin, the FSDP
strategy (any ``Accelerator`` source, a DeepSpeed ``zero3_init_flag`` included), the Trainer's
``TrainingArguments`` and the ``trainkit launch`` worker bootstrap. The first FSDP ``prepare``
with the option calls :func:`restore_from_pretrained`, so models loaded afterwards (an evaluation reload
of the saved weights) are real on every rank again.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

TRANSFORMERS_FLAGS = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
"""transformers' own switches for the option (non-persistent buffers on ranks other than local rank 0)."""

_original_from_pretrained: Any = None
"""transformers' own ``PreTrainedModel.from_pretrained`` function while this module replaces it."""


def load_on_rank0_only() -> bool:
    """Set transformers' flags and, on ranks other than 0 of a multi-process job, load on meta.

    Returns whether ``from_pretrained`` now builds on the meta device in this process. Calls that pass
    a ``device_map`` or a ``quantization_config`` are left alone. Idempotent.
    """
    global _original_from_pretrained
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
        if kwargs.get("device_map") is None and kwargs.get("quantization_config") is None:
            kwargs["device_map"] = "meta"
            logger.info("cpu_ram_efficient_loading: rank %s builds %s on the meta device; prepare() fills it "
                        "from rank 0.", os.environ.get("RANK"), cls.__name__)
        return original(cls, *args, **kwargs)

    pretrained: Any = modeling_utils.PreTrainedModel  # Any: mypy refuses assigning to a method
    pretrained.from_pretrained = classmethod(from_pretrained)
    return True


def restore_from_pretrained() -> None:
    """Undo :func:`load_on_rank0_only` in this process (no-op when it replaced nothing)."""
    global _original_from_pretrained
    if _original_from_pretrained is None:
        return
    from transformers import modeling_utils

    pretrained: Any = modeling_utils.PreTrainedModel
    pretrained.from_pretrained = classmethod(_original_from_pretrained)
    _original_from_pretrained = None
