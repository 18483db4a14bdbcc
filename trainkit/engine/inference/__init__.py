"""Big-model inference: running a model whose weights live partly off its device (CPU, disk, other devices).

One module per concept: ``hooks`` (module hooks around forward), ``align`` (device alignment and per-forward
weight offload), ``offload`` (the on-disk weight format and lazy weight maps), ``dispatch`` (cpu/disk offload
and ``dispatch_model``). Their public names are Accelerate's; the Accelerate module paths (``trainkit.hooks``,
``trainkit.big_modeling``, ``trainkit.utils.offload``, ``trainkit.utils.modeling``) re-export them.
Planning and loading: ``layer_sizes`` (parts, sizes, ties), ``memory_budget`` (``get_max_memory``,
``get_balanced_memory``), ``device_map`` (``infer_auto_device_map``, checking and cleaning maps), ``loading``
(``load_checkpoint_in_model``, ``load_checkpoint_and_dispatch``).
"""
