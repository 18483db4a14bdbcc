"""`trainkit merge-weights CHECKPOINT OUT`: a checkpoint's model weights as plain safetensors.

Reads a trainkit checkpoint (``save_state`` folder, a Trainer ``checkpoint-N`` folder, or a bare DCP
folder), verifies it against its manifest, gathers sharded (FSDP) weights into full tensors on this
one process, and writes ``OUT/model.safetensors`` (sharded with an index above ``--max-shard-size``)
that ``from_pretrained`` and ``load_state_dict`` read. ``config.json`` beside the checkpoint is copied.
"""

from __future__ import annotations

import argparse
import sys

HELP = "Merge a (sharded) checkpoint's model weights into safetensors loadable by from_pretrained / load_state_dict."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CHECKPOINT, OUT and the shard size."""
    parser.add_argument("checkpoint", help="save_state folder, Trainer checkpoint-N folder, or DCP folder")
    parser.add_argument("out", help="folder to write model.safetensors (+ index) into; created if needed")
    parser.add_argument("--model-index", type=int, default=0, help="which prepared model (default: 0)")
    parser.add_argument("--max-shard-size", default="10GB", help="split the weights above this size (default: 10GB)")
    parser.add_argument("--no-verify", action="store_true", help="skip the checksum verification")


def run(args: argparse.Namespace) -> int:
    """Merge and list what was written."""
    from trainkit.engine import CheckpointError, merge_weights

    try:
        written = merge_weights(args.checkpoint, args.out, index=args.model_index,
                                max_shard_size=args.max_shard_size, verify=not args.no_verify)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"trainkit merge-weights: error: {error}", file=sys.stderr)
        return 1
    print(f"Wrote {', '.join(written)} to {args.out}")
    return 0
