"""Launcher test worker using the engine: `Accelerator()` with no arguments reports what the launcher handed it."""

import json

import torch
from torch import nn

from trainkit import Accelerator


class BertLayer(nn.Module):
    """Named like the FSDP YAML's fsdp_transformer_layer_cls_to_wrap, without importing transformers."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x))


model = nn.Sequential(BertLayer(), BertLayer(), nn.Linear(8, 1))
model._no_split_modules = ["BertLayer"]
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
with accelerator.autocast():
    loss = model(torch.ones(4, 8, device=accelerator.device)).float().pow(2).mean()
accelerator.backward(loss)
optimizer.step()
options = getattr(getattr(accelerator, "strategy", None), "options", None)
report = {
    "rank": accelerator.process_index,
    "world": accelerator.num_processes,
    "distributed_type": str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)),
    "mixed_precision": accelerator.mixed_precision,
    "sharding_strategy": getattr(options, "sharding_strategy", None),
    "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
}
# torch.compile from the launcher (--dynamo_*): which modules were compiled in place, and no wrapper prefixes.
report["compiled"] = sorted({type(m).__name__ for m in model.modules() if getattr(m, "_compiled_call_impl", None)})
report["state_dict_keys"] = sorted(accelerator.unwrap_model(model).state_dict())
report["loss_finite"] = bool(torch.isfinite(loss).item())
report["optimizer"] = type(getattr(optimizer, "optimizer", optimizer)).__name__
report["offload_params"] = getattr(options, "offload_params", None)
print("REPORT " + json.dumps(report), flush=True)
accelerator.end_training()
