"""``accelerate.utils.offload``'s path: weights written to disk (``index.json`` and ``.dat`` files) and the lazy
weight maps big-model inference reads them through (implemented in :mod:`trainkit.engine.inference.offload`)."""

from trainkit.engine.inference.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from trainkit.utils.model_tensors import extract_submodules_state_dict

__all__ = ["OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
           "offload_state_dict", "offload_weight", "save_offload_index"]
