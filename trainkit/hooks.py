"""``accelerate.hooks``'s path: the module hooks of big-model inference, named so imports work; each refuses
when used (trainkit does not dispatch or offload models; see ``trainkit.utils.unsupported``)."""

from trainkit.utils.unsupported import refusing_module

__all__ = ["AlignDevicesHook", "CpuOffload", "LayerwiseCastingHook", "ModelHook", "SequentialHook",
           "UserCpuOffloadHook", "add_hook_to_module", "attach_align_device_hook",
           "attach_align_device_hook_on_blocks", "attach_execution_device_hook", "remove_hook_from_module",
           "remove_hook_from_submodules"]

__getattr__ = refusing_module(__name__, tuple(__all__))
