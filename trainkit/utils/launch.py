"""``accelerate.utils.launch``'s path. ``prepare_simple_launcher_cmd_env`` is ``trainkit launch``'s own one-process
step (``trainkit.cli.launch_steps``: the command and environment it starts the script with). The other names are
helpers of Accelerate's launchers, named so imports work; each refuses when used: ``trainkit launch`` hands several
processes to ``torch.distributed.run`` (its c10d rendezvous picks the port), never mpirun, SageMaker or a TPU
launcher."""

from trainkit.cli.launch_steps import prepare_simple_launcher_cmd_env
from trainkit.utils.unsupported import refusing_module

_REFUSED = ("PrepareForLaunch", "env_var_path_add", "prepare_deepspeed_cmd_env",
            "prepare_extend_env_parallelism_config", "prepare_multi_gpu_env", "prepare_sagemager_args_inputs",
            "prepare_tpu", "setup_fp8_env")
__all__ = ["prepare_simple_launcher_cmd_env", *_REFUSED]

__getattr__ = refusing_module(__name__, _REFUSED)
