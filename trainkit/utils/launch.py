"""``accelerate.utils.launch``'s path: the helpers ``accelerate launch`` builds its commands with, named so
imports work; each refuses when used (``trainkit launch`` builds its own ``torch.distributed.run`` command)."""

from trainkit.utils.unsupported import refusing_module

__all__ = ["PrepareForLaunch", "env_var_path_add", "prepare_deepspeed_cmd_env", "prepare_extend_env_parallelism_config",
           "prepare_multi_gpu_env", "prepare_sagemager_args_inputs", "prepare_simple_launcher_cmd_env", "prepare_tpu",
           "setup_fp8_env"]

__getattr__ = refusing_module(__name__, tuple(__all__))
