"""Accelerate's semantics a script relies on, run in real processes: ``semantics_checks.py OUT ENGINE``.

ENGINE is ``trainkit`` or ``accelerate`` (the installed library, as the oracle: the same code runs under
both). Writes ``training_rank{r}.safetensors`` (final parameters of the recipes below, and on rank 0 the
same recipes trained by a plain one-process PyTorch loop) and ``split_rank{r}.json``
(``split_between_processes`` results).

Training recipe: a two-parameter regression model, a shuffled DataLoader built with the user's own
``torch.Generator``, 3 epochs, the same global batch (16) on any number of processes.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset

OUT, ENGINE = Path(sys.argv[1]), sys.argv[2]
engine = importlib.import_module(ENGINE)
engine_utils = importlib.import_module(f"{ENGINE}.utils")
engine_data = importlib.import_module(f"{ENGINE}.data_loader")
GLOBAL_BATCH, EPOCHS, GENERATOR_SEED = 16, 3, 42


class Line(Dataset):
    def __init__(self, length: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(length, generator=generator)
        self.y = 2 * self.x + 3 + 0.1 * torch.randn(length, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class AffineModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.0))
        self.b = nn.Parameter(torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x + self.b


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1) if name == "sgd" else torch.optim.AdamW(model.parameters(), lr=0.05)


def make_loader(batch_size: int, generator: torch.Generator, seedable: bool) -> DataLoader:
    if seedable:  # the user builds Accelerate's seedable sampler around their generator
        sampler = engine_data.SeedableRandomSampler(Line(), generator=generator, num_samples=len(Line()))
        return DataLoader(Line(), batch_size=batch_size, sampler=sampler)
    return DataLoader(Line(), batch_size=batch_size, shuffle=True, generator=generator)


def train(loop, optimizer_name: str, batch_size: int, seedable: bool, accelerator=None) -> dict[str, torch.Tensor]:
    engine_utils.set_seed(7)
    generator = torch.Generator().manual_seed(GENERATOR_SEED)
    model, loader = AffineModel(), make_loader(batch_size, generator, seedable)
    optimizer = make_optimizer(optimizer_name, model)
    if accelerator is not None:
        loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
    generator.manual_seed(GENERATOR_SEED)  # after prepare: the prepared loader must still follow it
    for _ in range(EPOCHS):
        for batch in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loop(loss)
            optimizer.step()
    inner = accelerator.unwrap_model(model) if accelerator is not None else model
    return {name: value.detach().cpu().clone() for name, value in inner.state_dict().items()}


def training_runs(state) -> dict[str, torch.Tensor]:
    results: dict[str, torch.Tensor] = {}
    for seedable in (False, True):
        for optimizer_name in ("sgd", "adamw"):
            for split in (False, True):
                config = engine_utils.DataLoaderConfiguration(split_batches=split, use_seedable_sampler=seedable)
                accelerator = engine.Accelerator(dataloader_config=config)
                per_process = GLOBAL_BATCH if split else GLOBAL_BATCH // state.num_processes
                trained = train(accelerator.backward, optimizer_name, per_process, seedable, accelerator)
                key = f"seedable{int(seedable)}_{optimizer_name}_split{int(split)}"
                results.update({f"{key}.{name}": value for name, value in trained.items()})
            if state.process_index == 0:
                plain = train(lambda loss: loss.backward(), optimizer_name, GLOBAL_BATCH, seedable)
                key = f"seedable{int(seedable)}_{optimizer_name}_plain"
                results.update({f"{key}.{name}": value for name, value in plain.items()})
    return results


def split_runs(state) -> dict[str, object]:
    from datasets import Dataset as HFDataset

    results: dict[str, object] = {}

    def samples() -> dict[str, object]:  # fresh each call: Accelerate splits a dict's values in place
        return {"list": list(range(7)), "tuple": tuple(range(7)), "tensor": torch.arange(14).reshape(7, 2),
                "dict": {"ids": torch.arange(7), "names": [f"n{i}" for i in range(7)]},
                "dataset": HFDataset.from_list([{"k": i} for i in range(7)]), "short": [0], "empty": []}

    for name in samples():
        for padding in (False, True):
            if padding and name in ("tuple", "empty"):
                continue  # Accelerate fails on these (a tuple plus a list; the last item of nothing); trainkit pads them
            with state.split_between_processes(samples()[name], apply_padding=padding) as part:
                results[f"{name}_pad{int(padding)}"] = describe(part)
    return results


def describe(part: object) -> object:
    """A JSON view of a share that keeps its type."""
    if isinstance(part, torch.Tensor):
        return {"type": "tensor", "value": part.tolist()}
    if isinstance(part, dict):
        return {"type": "dict", "value": {key: describe(value) for key, value in part.items()}}
    if type(part).__name__ == "Dataset":
        return {"type": "Dataset", "len": len(part), "value": list(part["k"])}
    return {"type": type(part).__name__, "value": list(part)}


def main() -> None:
    state = engine.PartialState(cpu=True)  # CPU and gloo under both engines (Accelerate needs it said)
    rank = state.process_index
    save_file(training_runs(state), OUT / f"training_rank{rank}.safetensors")
    (OUT / f"split_rank{rank}.json").write_text(json.dumps(split_runs(state)))
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
