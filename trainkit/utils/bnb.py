"""``accelerate.utils.bnb``'s path: bitsandbytes quantization helpers, named so imports work; each refuses when
used (load quantized models with transformers; see ``trainkit.utils.unsupported``)."""

from trainkit.utils.unsupported import refusing_module

__all__ = ["get_keys_to_not_convert", "get_parameter_device", "get_quantized_model_device_map",
           "has_4bit_bnb_layers", "load_and_quantize_model", "quantize_and_offload_8bit", "replace_with_bnb_layers"]

__getattr__ = refusing_module(__name__, tuple(__all__))
