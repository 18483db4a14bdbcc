"""``accelerate.utils.offload``'s path: ``extract_submodules_state_dict`` works; the weight-offloading helpers
of big-model inference are named and refuse when used (see ``trainkit.utils.unsupported``)."""

from trainkit.utils.model_tensors import extract_submodules_state_dict
from trainkit.utils.unsupported import refusing_module

_REFUSED = ("OffloadedWeightsLoader", "PrefixedDataset", "load_offloaded_weight", "offload_state_dict",
            "offload_weight", "save_offload_index")

__all__ = ["extract_submodules_state_dict", *_REFUSED]

__getattr__ = refusing_module(__name__, _REFUSED)
