"""2 gloo ranks for the Accelerator keyword proofs (tests/engine/test_accelerator_keyword_effects.py).

Run under ``torch.distributed.run --nproc_per_node 2 keyword_effects.py OUT``; each rank writes ``OUT/rank<N>.json``:
the rows of the batches a prepared DataLoader gives it (batches of 4 over 13 samples) with split_batches,
even_batches and dataloader_config, and whether a prepared model's parameters are sharded DTensors with
fsdp_plugin, parallelism_config and deepspeed_plugin (ZeRO-3 runs on FSDP2).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator, DataLoaderConfiguration, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig

OUT = Path(sys.argv[1])


def rows(**keywords) -> list[int]:
    loader = DataLoader(TensorDataset(torch.arange(13.0)), batch_size=4)
    return [len(batch[0]) for batch in Accelerator(**keywords).prepare(loader)]


def sharding(**keywords) -> dict:
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    prepared = Accelerator(**keywords).prepare(model)
    params = list(prepared.parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return {"all_dtensor": all(isinstance(p, DTensor) for p in params),
            "local_fraction": local / sum(p.numel() for p in params)}


facts = {
    "default_rows": rows(),
    "split_batches": rows(split_batches=True),
    "even_batches": rows(even_batches=False),
    "dataloader_config": rows(dataloader_config=DataLoaderConfiguration(split_batches=True)),
    "fsdp_plugin": sharding(fsdp_plugin=FullyShardedDataParallelPlugin()),
    "parallelism_config": sharding(parallelism_config=ParallelismConfig(dp_shard_size=2)),
    "deepspeed_plugin": sharding(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3)),
}
(OUT / f"rank{dist.get_rank()}.json").write_text(json.dumps(facts))
