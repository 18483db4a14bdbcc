"""Gradient accumulation with a prepared model, optimizer and scheduler (CPU, gloo): the tensors to compare.

Run under torchrun with 2 processes: ``accumulation_sync.py OUT``. 40 samples, 4 per process and micro-batch,
2 accumulation steps: windows of micro-batches [0, 1], [2, 3] and the short [4]. After each backward the
worker records this process's gradients and the two gradients it could equal: the one from this process's
micro-batches only (no all-reduce yet) and the one from every process's micro-batches (all-reduced), both
recomputed on a plain copy of the model with each loss divided by the accumulation steps. It also records
the learning rate of the prepared scheduler and of a plain one stepped once per process at each window end.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator

OUT = Path(sys.argv[1])
STEPS = 2


def main() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=STEPS)
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3)
    net = nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    plain_optimizer = torch.optim.AdamW(nn.Linear(3, 1).parameters(), lr=1e-2)
    plain_scheduler = torch.optim.lr_scheduler.LambdaLR(plain_optimizer, lambda step: 0.9**step)
    model, optimizer, scheduler, loader = accelerator.prepare(net, optimizer, scheduler,
                                                              DataLoader(data, batch_size=4))
    local_copy, global_copy = copy.deepcopy(net), copy.deepcopy(net)
    records: dict[str, torch.Tensor] = {}
    for step, (inputs, targets) in enumerate(loader):
        every_inputs, every_targets = accelerator.gather((inputs, targets))
        for reference, (xs, ys) in ((local_copy, (inputs, targets)), (global_copy, (every_inputs, every_targets))):
            (nn.functional.mse_loss(reference(xs), ys) / STEPS).backward()
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(inputs), targets))
            records[f"{step}.grad"] = net.weight.grad.detach().clone()
            records[f"{step}.local_grad"] = local_copy.weight.grad.detach().clone()
            records[f"{step}.global_grad"] = global_copy.weight.grad.detach().clone()
            records[f"{step}.synced"] = torch.tensor(accelerator.sync_gradients)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            for _ in range(accelerator.num_processes):
                plain_scheduler.step()
            # The references restart each window from the model's new parameters.
            local_copy, global_copy = copy.deepcopy(net), copy.deepcopy(net)
        records[f"{step}.lr"] = torch.tensor(scheduler.get_last_lr()[0], dtype=torch.float64)
        records[f"{step}.plain_lr"] = torch.tensor(plain_scheduler.get_last_lr()[0], dtype=torch.float64)
    save_file(records, OUT / f"rank{accelerator.process_index}.safetensors")


if __name__ == "__main__":
    main()
