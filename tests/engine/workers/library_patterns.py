"""Patterns that trainer libraries built on Accelerate use, run on 2 gloo processes: ``library_patterns.py OUT``.

Not any library's code: the calls they make, in the order they make them (written from reading
pytorch-accelerated's and denoising-diffusion-pytorch's trainers, which ran against trainkit unchanged):

- manual accumulation: ``no_sync(model)`` on all but the last micro-batch of each window, the window
  ending every 2 micro-batches or at ``len(loader)``, the loss divided by the steps by the caller;
- best model: ``save(unwrap_model(model).state_dict(), path)`` (main process writes), then a fresh model
  loads it; ``get_state_dict(model)``;
- an endless ``itertools.cycle``-style loop over a prepared loader (``next`` across epochs).

Writes ``rank{r}.safetensors`` (tensors) and ``rank{r}.json`` (facts) for the test to compare.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator

OUT = Path(sys.argv[1])
STEPS = 2


def endless(loader):
    while True:
        yield from loader


def main() -> None:
    accelerator = Accelerator(split_batches=False)  # the pre-1.0 keyword some libraries still pass
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4, shuffle=True))
    tensors: dict[str, torch.Tensor] = {}
    facts: dict[str, object] = {"len": len(loader), "scaler_is_none": accelerator.scaler is None}
    for step, (inputs, targets) in enumerate(loader):
        window_ends = (step + 1) % STEPS == 0 or step + 1 == len(loader)
        # Forward and backward both inside no_sync: DDP decides in forward whether backward communicates.
        with contextlib.nullcontext() if window_ends else accelerator.no_sync(model):
            accelerator.backward(nn.functional.mse_loss(model(inputs), targets) / STEPS)
        tensors[f"grad{step}"] = accelerator.unwrap_model(model).weight.grad.detach().clone()
        if window_ends:
            optimizer.step()
            optimizer.zero_grad()
    best = OUT / "best_model.pt"
    accelerator.save(accelerator.unwrap_model(model).state_dict(), best)
    accelerator.wait_for_everyone()
    restored = nn.Linear(3, 1)
    restored.load_state_dict(torch.load(best, weights_only=True))
    tensors["trained"] = accelerator.unwrap_model(model).weight.detach().clone()
    tensors["restored"] = restored.weight.detach().clone()
    tensors["state_dict_weight"] = accelerator.get_state_dict(model)["weight"].clone()
    stream = endless(loader)
    seen = [next(stream)[0] for _ in range(3 * len(loader))]  # three epochs through one endless iterator
    tensors["endless"] = torch.stack([batch for batch in seen])
    (OUT / f"rank{accelerator.process_index}.json").write_text(json.dumps(facts))
    save_file(tensors, OUT / f"rank{accelerator.process_index}.safetensors")


if __name__ == "__main__":
    main()
