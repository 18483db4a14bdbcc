"""`trainkit merge-weights CHECKPOINT OUT`: a checkpoint's model weights as plain safetensors.

Reads a trainkit checkpoint (``save_state`` folder, a Trainer ``checkpoint-N`` folder, or a bare DCP
folder), verifies it against its manifest, gathers sharded (FSDP) weights into full tensors on this
one process, and writes ``OUT/model.safetensors`` (sharded with an index above ``--max-shard-size``)
that ``from_pretrained`` and ``load_state_dict`` read. ``config.json`` beside the checkpoint is copied.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

HELP = "Merge a (sharded) checkpoint's model weights into safetensors loadable by from_pretrained / load_state_dict."

_COPIED_BESIDE_WEIGHTS = ("config.json", "generation_config.json")
logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CHECKPOINT, OUT and the shard size."""
    parser.add_argument("checkpoint", help="save_state folder, Trainer checkpoint-N folder, or DCP folder")
    parser.add_argument("out", help="folder to write model.safetensors (+ index) into; created if needed")
    parser.add_argument("--model-index", type=int, default=0, help="which prepared model (default: 0)")
    parser.add_argument("--max-shard-size", default="10GB", help="split the weights above this size (default: 10GB)")
    parser.add_argument("--no-verify", action="store_true", help="skip the checksum verification")


def find_model_source(checkpoint: str, index: int = 0) -> tuple[str, str]:
    """``(kind, path)`` of the weights in ``checkpoint``: kind is "safetensors" or "dcp"."""
    from trainkit.engine.checkpoint import model_state

    candidates = [checkpoint, os.path.join(checkpoint, "engine_state")]
    for folder in candidates:
        sharded = os.path.join(folder, model_state.sharded_model_dir(index))
        if os.path.isfile(os.path.join(sharded, ".metadata")):
            return "dcp", sharded
        full = os.path.join(folder, model_state.model_file(index))
        if os.path.isfile(full):
            return "safetensors", full
    if os.path.isfile(os.path.join(checkpoint, ".metadata")):
        return "dcp", checkpoint
    raise FileNotFoundError(f"No model weights (model {index}) found in {checkpoint}.")


def merge_weights(checkpoint: str, out: str, *, index: int = 0, max_shard_size: str = "10GB", verify: bool = True) -> list[str]:
    """Write the full weights of ``checkpoint``'s ``index``-th model into ``out``; return the files written."""
    from trainkit.engine.checkpoint import atomic, sharded_io, state_io
    from trainkit.engine.checkpoint.serialization import save_safetensors
    from trainkit.engine.checkpoint.storage import SharedFolderStorage

    kind, source = find_model_source(checkpoint, index)
    manifest_root = next((folder for folder in (os.path.dirname(source), os.path.dirname(os.path.dirname(source)))
                          if os.path.isfile(os.path.join(folder, atomic.MANIFEST_NAME))), None)
    if verify and manifest_root is not None:
        atomic.verify_checkpoint(manifest_root)
    elif verify:
        logger.warning("%s has no manifest: its files cannot be verified.", checkpoint)
    state = sharded_io.load_full_tensors(source) if kind == "dcp" else state_io.load_tensors(SharedFolderStorage(), source)
    os.makedirs(out, exist_ok=True)
    written = save_safetensors(state, out, max_shard_size)
    for folder in {os.path.dirname(source), checkpoint, os.path.dirname(os.path.normpath(checkpoint))}:
        for name in _COPIED_BESIDE_WEIGHTS:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.exists(os.path.join(out, name)):
                shutil.copyfile(path, os.path.join(out, name))
                written.append(name)
    return written


def run(args: argparse.Namespace) -> int:
    """Merge and list what was written."""
    from trainkit.engine.checkpoint import CheckpointError

    try:
        written = merge_weights(args.checkpoint, args.out, index=args.model_index,
                                max_shard_size=args.max_shard_size, verify=not args.no_verify)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"trainkit merge-weights: error: {error}", file=sys.stderr)
        return 1
    print(f"Wrote {', '.join(written)} to {args.out}")
    return 0
