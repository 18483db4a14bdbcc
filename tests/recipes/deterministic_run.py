"""Run a recipe script with deterministic kernels: ``python deterministic_run.py SCRIPT ARGS...``.

Used by the GPU comparison of the plain and the Accelerator MNIST loops, so that both run the same script code
under the same kernel settings without the recipes carrying test switches. On CUDA it asks torch for
deterministic algorithms (an op without one raises, naming itself), cuDNN's deterministic algorithms without
benchmarking, and TF32 off for matmuls and convolutions. ``CUBLAS_WORKSPACE_CONFIG`` must already be in the
environment: cuBLAS reads it when the process first needs a workspace.
"""

import os
import runpy
import sys

import torch

if __name__ == "__main__":
    if torch.cuda.is_available() and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        sys.exit("deterministic_run.py: set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment first")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` would: the recipe imports its siblings
    runpy.run_path(script, run_name="__main__")
