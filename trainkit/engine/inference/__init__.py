"""Big-model inference: running a model whose weights live partly off its device (CPU, disk, other devices).

One module per concept: ``hooks`` (module hooks around forward), ``align`` (device alignment and per-forward
weight offload), ``offload`` (the on-disk weight format and lazy weight maps), ``dispatch`` (cpu/disk offload
and ``dispatch_model``). Their public names are Accelerate's; the Accelerate module paths (``trainkit.hooks``,
``trainkit.big_modeling``, ``trainkit.utils.offload``, ``trainkit.utils.modeling``) re-export them.
"""
