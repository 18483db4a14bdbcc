"""A checkpoint's model weights as plain safetensors (``trainkit merge-weights``): find them in a ``save_state``
folder, a Trainer ``checkpoint-N`` folder or a bare DCP folder, verify them against the manifest, gather
sharded (FSDP) weights into full tensors on this one process, write ``model.safetensors`` (with an index
above the shard size) and copy ``config.json`` beside them."""

from __future__ import annotations

import logging
import os
import shutil

_COPIED_BESIDE_WEIGHTS = ("config.json", "generation_config.json")
logger = logging.getLogger(__name__)


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
