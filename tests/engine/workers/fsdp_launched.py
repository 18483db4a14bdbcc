"""A user script started by ``trainkit launch --config_file <the issue's YAML>``: ``Accelerator()`` with no arguments.

Writes ``OUT/launched.json`` (rank 0) with what the launcher's config turned into and the first losses.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsdp_common import gather_floats, train, write_results
from torch.distributed.tensor import DTensor

from trainkit import Accelerator
from trainkit.engine.strategies.fsdp.sharding import local_numel

OUT = Path(sys.argv[1])


def main() -> None:
    run = train(Accelerator, steps=3)
    params = list(run.model.parameters())
    options = run.accelerator.strategy.options
    write_results(OUT, "launched", {
        "distributed_type": run.accelerator.distributed_type.value,
        "num_processes": run.accelerator.num_processes,
        "mixed_precision": run.accelerator.mixed_precision,
        "sharding_strategy": options.sharding_strategy,
        "state_dict_type": options.state_dict_type,
        "transformer_layer_cls_to_wrap": options.transformer_layer_cls_to_wrap,
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_fraction": local_numel(params) / sum(p.numel() for p in params),
        "losses": gather_floats(run.losses[-1]),
    })


if __name__ == "__main__":
    main()
