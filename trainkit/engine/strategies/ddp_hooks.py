"""DDP gradient communication hooks chosen by name (``DistributedDataParallelKwargs(comm_hook=...)``).

The hooks are torch's own (``torch.distributed.algorithms.ddp_comm_hooks``); this module only maps
Accelerate's names onto them and registers the chosen one on a wrapped model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from trainkit.utils.enums import DDPCommunicationHookType


def register_comm_hook(model: DistributedDataParallel, hook: Any, wrapper: Any = None,
                       state_option: dict[str, Any] | None = None) -> None:
    """Register the hook named ``hook`` (optionally compressed by ``wrapper``) on ``model``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hook = DDPCommunicationHookType(hook)
    wrapper = DDPCommunicationHookType(wrapper or DDPCommunicationHookType.NO)
    if hook is DDPCommunicationHookType.NO:
        return
    plain = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
             DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook}
    power = {DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
             DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook}
    if hook in plain:
        if wrapper is not DDPCommunicationHookType.NO:
            raise ValueError(f"comm_wrapper={wrapper.value!r} only wraps a PowerSGD hook, not comm_hook={hook.value!r}.")
        model.register_comm_hook(state=None, hook=plain[hook])
        return
    function: Callable[..., Any] = power[hook]  # a wrapper below returns a hook of another signature
    wrappers = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}
    if wrapper in wrappers:
        function = wrappers[wrapper](function)
    state = powerSGD_hook.PowerSGDState(process_group=None, **(state_option or {}))
    model.register_comm_hook(state=state, hook=function)
