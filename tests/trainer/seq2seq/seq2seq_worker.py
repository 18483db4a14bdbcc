"""Worker (torchrun, gloo on CPU): tiny_seq2seq.run's evaluation and prediction (no training) under ``argv[1]``
(trainkit or transformers) for the models named in ``argv[3:]``; rank 0 writes the results as JSON to ``argv[2]``."""

import importlib
import json
import sys

import torch.distributed as dist

from tests.trainer.seq2seq import tiny_seq2seq


def main() -> None:
    lib = importlib.import_module(sys.argv[1])
    results = {}
    for kind in sys.argv[3:]:
        results[kind] = tiny_seq2seq.run(lib, kind, f"{sys.argv[2]}.{kind}.out", train=False)
        results[kind]["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(sys.argv[2], "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main()
