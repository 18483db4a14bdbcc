"""`trainkit estimate-memory`: how much memory a Hub model (or a local model folder) needs to load and to train.

The model is built on torch's meta device from its config alone (transformers' ``AutoModel.from_config``, or
``timm.create_model`` for timm models): nothing is downloaded but the config, nothing allocated. Per dtype it reports
the largest layer (the biggest piece loaded at once: a leaf module, or a module the model declares unsplittable in
``_no_split_modules``), the total, and training with Adam: weights, gradients and Adam's two states, all in fp32 as
trainkit's mixed precision keeps them (autocast computes in half precision, the stored tensors stay fp32), so
4 x the fp32 size for float32, float16 and bfloat16 alike. Activations depend on the batch and are not counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .command_parser import command_parser

HELP = "Estimate the memory a Hub model needs to load and to train (built on the meta device from its config)."
DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
_BYTES_PER_FP32 = {"float32": 1.0, "float16": 0.5, "bfloat16": 0.5, "int8": 0.25, "int4": 0.125}
TRAINABLE_DTYPES = ("float32", "float16", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Accelerate's estimate-memory flags."""
    parser.add_argument("model_name", help="A Hub model id (or a local folder with a config.json).")
    parser.add_argument("--library_name", choices=("transformers", "timm"), default=None,
                        help="The model's library (default: the Hub's metadata; a local folder is transformers).")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32", "float16", "int8", "int4"],
                        help="The dtypes to report.")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Allow the model's own code from the Hub to run (only for repositories you trust).")


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's name for this command's parser (``trainkit estimate-memory``'s own)."""
    return command_parser("estimate-memory", sys.modules[__name__], subparsers)


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for ``repo``, or ``"gated"`` (no access) / ``"repo"`` (no such repository)."""
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except GatedRepoError:
        return "gated"
    except RepositoryNotFoundError:
        return "repo"


def add_timm_hub_prefix(model_name: str) -> str:
    """``timm/resnet50.a1_in1k`` -> ``hf-hub:timm/resnet50.a1_in1k`` (timm >= 1.0.29 needs the source named);
    a bare architecture name or one that already names its source is returned as it is."""
    return model_name if ":" in model_name or "/" not in model_name else f"hf-hub:{model_name}"


def _library(args: argparse.Namespace) -> str:
    """Which library builds the model; raises OSError for a gated or missing Hub repo (nothing to read)."""
    if Path(args.model_name).is_dir():
        return args.library_name or "transformers"
    info = verify_on_hub(args.model_name)
    if info in ("gated", "repo"):
        reason = ("is gated: log in (`hf auth login`) with an account that has access" if info == "gated"
                  else "does not exist on the Hub (or is private: log in with an account that has access)")
        raise OSError(f"Model {args.model_name!r} {reason}.")
    library = args.library_name or getattr(info, "library_name", None)
    if not library:
        raise ValueError(f"Model {args.model_name!r} has no library metadata on the Hub: pass --library_name "
                         "transformers or timm.")
    return str(library)


def empty_model(args: argparse.Namespace) -> Any:
    """The model built on the meta device from its config (no weights read, no memory allocated)."""
    import torch

    library = _library(args)
    with torch.device("meta"):
        if library == "timm":
            import timm  # type: ignore[import-not-found]  # optional: only timm models need it

            return timm.create_model(add_timm_hub_prefix(args.model_name), pretrained=False)
        if library != "transformers":
            raise ValueError(f"Library {library!r} is not one estimate-memory builds: transformers or timm.")
        import transformers

        config = transformers.AutoConfig.from_pretrained(args.model_name, trust_remote_code=args.trust_remote_code)
        auto_map = getattr(config, "auto_map", None) or {}
        constructor = next((getattr(transformers, name) for name in auto_map if name.startswith("AutoModelFor")),
                           transformers.AutoModel)
        return constructor.from_config(config, dtype=torch.float32, trust_remote_code=args.trust_remote_code)


def sizes(model: Any) -> tuple[int, int]:
    """(total bytes, largest layer's bytes) of ``model`` as built (fp32): parameters and buffers."""
    no_split = set(getattr(model, "_no_split_modules", None) or ())

    def own_bytes(module: Any, recurse: bool) -> int:
        tensors = list(module.parameters(recurse=recurse)) + list(module.buffers(recurse=recurse))
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    def largest(module: Any) -> int:
        children = list(module.children())
        if not children or type(module).__name__ in no_split:
            return own_bytes(module, recurse=True)
        return max([own_bytes(module, recurse=False)] + [largest(child) for child in children])

    return own_bytes(model, recurse=True), largest(model)


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """One row per dtype: [dtype, largest layer bytes, total bytes, training-with-Adam bytes by part]."""
    total, layer = sizes(empty_model(args))
    rows: list[list[Any]] = []
    for dtype in args.dtypes:
        scale = _BYTES_PER_FP32[dtype]
        training = ({"weights": total, "gradients": total, "optimizer states": 2 * total, "total": 4 * total}
                    if dtype in TRAINABLE_DTYPES else {})
        rows.append([dtype, layer * scale, total * scale, training])
    return rows


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def estimate_command(args: argparse.Namespace) -> None:
    """Print the table of :func:`gather_data`."""
    print(f"Memory for {args.model_name} (training: weights + gradients + Adam states, fp32; activations not counted)")
    header = ("dtype", "largest layer", "total", "training (Adam)")
    lines = [header] + [(dtype, _human(layer), _human(total), _human(training["total"]) if training else "n/a")
                        for dtype, layer, total, training in gather_data(args)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))


def run(args: argparse.Namespace) -> int:
    """``trainkit estimate-memory``."""
    estimate_command(args)
    return 0
