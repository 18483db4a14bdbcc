"""``accelerate.big_modeling``'s path: ``init_empty_weights`` and ``init_on_device`` (building a model without
memory), and big-model inference: CPU/disk offload, ``dispatch_model`` and layerwise casting (implemented in
:mod:`trainkit.engine.inference`). Names not implemented yet refuse when used (``trainkit.utils.unsupported``)."""

from typing import Any

from trainkit.engine.inference.dispatch import attach_layerwise_casting_hooks, cpu_offload, cpu_offload_with_hook
from trainkit.engine.inference.dispatch import disk_offload, dispatch_model
from trainkit.engine.inference.loading import load_checkpoint_and_dispatch
from trainkit.utils.modeling import init_empty_weights, init_on_device
from trainkit.utils.unsupported import refusing_module

_REFUSED: tuple[str, ...] = ()

__all__ = ["init_empty_weights", "init_on_device", *_REFUSED]
__all__ += ["attach_layerwise_casting_hooks", "cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model"]
__all__ += ["load_checkpoint_and_dispatch"]


def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Accelerate's (private) name for the check trainkit runs on every model prepared with ``sp_size > 1``:
    layers other than full attention (linear/recurrent, sliding, chunked) are refused (a ``ValueError``)."""
    from trainkit.engine.parallel.attention import refuse_layer_types

    refuse_layer_types(model, "sp")


__getattr__ = refusing_module(__name__, _REFUSED)
