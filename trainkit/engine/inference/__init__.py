"""Big-model inference: planning where each part of a model goes (device maps), loading a checkpoint along such a
plan, and running the model spread over accelerators, CPU and disk (hooks, offload, dispatch).

Scripts reach it through Accelerate's paths (``trainkit.big_modeling``, ``trainkit.hooks``,
``trainkit.utils.modeling``, ``trainkit.utils.offload``), which re-export from the modules here.
"""
