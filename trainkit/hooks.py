"""``accelerate.hooks``'s path: module hooks around ``forward`` and the device-alignment / offload hooks of
big-model inference (implemented in :mod:`trainkit.engine.inference`)."""

from trainkit.engine.inference.align import (
    AlignDevicesHook,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
)
from trainkit.engine.inference.hooks import (
    CpuOffload,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = ["AlignDevicesHook", "CpuOffload", "LayerwiseCastingHook", "ModelHook", "SequentialHook",
           "UserCpuOffloadHook", "add_hook_to_module", "attach_align_device_hook",
           "attach_align_device_hook_on_blocks", "attach_execution_device_hook", "remove_hook_from_module",
           "remove_hook_from_submodules"]
