"""What the engine actually runs with, observed from inside a worker (shared by the settings workers)."""

import json

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class BertLayer(nn.Module):
    """A wrap unit (named like the FSDP YAML's layer class) that records the dtype its forward computes in: autocast's
    where autocast is on, else its weight's (FSDP2's mixed-precision policy casts the gathered weights, and the
    engine turns autocast off inside bf16/fp16 units)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.compute_dtype = None

    def forward(self, x):
        autocast = torch.is_autocast_enabled(x.device.type)
        self.compute_dtype = str(torch.get_autocast_dtype(x.device.type) if autocast else self.linear.weight.dtype)
        return torch.relu(self.linear(x))


def build_model() -> nn.Module:
    """Two wrap units and a head; ``_no_split_modules`` makes FSDP shard each BertLayer as a unit."""
    torch.manual_seed(0)
    model = nn.Sequential(BertLayer(), BertLayer(), nn.Linear(8, 1))
    model._no_split_modules = ["BertLayer"]
    return model


def observed(accelerator, model: nn.Module) -> dict:
    """Facts about the run, read off the objects that act (not off the configuration)."""
    unit = model[0]
    weight = unit.linear.weight
    return {
        "rank": accelerator.process_index,
        "device": accelerator.device.type,
        "mixed_precision": accelerator.mixed_precision,
        "compute_dtype_in_forward": unit.compute_dtype,
        "distributed_type": accelerator.distributed_type.value,
        "sharded": isinstance(weight, DTensor),
        "provenance": provenance(accelerator),
    }


def provenance(accelerator) -> dict:
    """Where the engine's settings came from (FSDP: the sharding strategy only)."""
    return {key: source for key, source in accelerator.config.provenance.items()
            if not key.startswith("fsdp.") or key == "fsdp.sharding_strategy"}


def report(facts: dict) -> None:
    """One REPORT line per rank for the test to parse."""
    print("REPORT " + json.dumps(facts), flush=True)
