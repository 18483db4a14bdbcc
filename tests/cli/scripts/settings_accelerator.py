"""An Accelerate-style script that sets nothing: the launcher's flags must decide precision, accumulation,
device and FSDP; then a second Accelerator overrides two of them explicitly (one notice line expected)."""

import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from settings_common import build_model, observed, provenance, report  # noqa: E402

from trainkit import Accelerator  # noqa: E402

accelerator = Accelerator()
model = build_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.ones(16, 8)), batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
syncs = []
for (batch,) in loader:
    with accelerator.accumulate(model):
        loss = model(batch).float().pow(2).mean()
        resharded_after_forward = isinstance(model[0].linear.weight, DTensor)
        accelerator.backward(loss)
        syncs.append(accelerator.sync_gradients)
        optimizer.step()
        optimizer.zero_grad()
facts = observed(accelerator, model)
facts.update(syncs=syncs, gradient_accumulation_steps=accelerator.gradient_accumulation_steps,
             resharded_after_forward=resharded_after_forward)

explicit = Accelerator(mixed_precision="no", gradient_accumulation_steps=2)
facts["explicit"] = {"mixed_precision": explicit.mixed_precision,
                     "gradient_accumulation_steps": explicit.gradient_accumulation_steps,
                     "provenance": provenance(explicit)}
report(facts)
