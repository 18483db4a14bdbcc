"""The small model the hook and dispatch tests place, offload and hook: two linears around a norm with running
statistics (a buffer), and a keyword argument so a hooked forward's signature can be checked."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.linear2(self.norm(self.linear1(x))) * scale
