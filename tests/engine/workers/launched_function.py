"""A function for notebook_launcher tests: each process builds an Accelerator and all-reduces its rank."""

from __future__ import annotations


def rank_sum(offset: int) -> tuple[int, int, float]:
    import torch

    from trainkit import Accelerator

    accelerator = Accelerator(cpu=True)
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index + offset)]), reduction="sum")
    return accelerator.process_index, accelerator.num_processes, total.item()
