"""The script ``trainkit test`` launches on the configured processes: does distributed training work here?

Checks, on every process, with the launch config's processes, devices and mixed precision: the processes see each
other (gather of every rank's number, a sum), a prepared data loader hands each process its own part of the data,
and a few training steps keep the model identical on every process (the gradients were averaged). Any failure is an
AssertionError naming what differed; success prints one line from the main process.
"""

from __future__ import annotations

from typing import Any

SUCCESS = "trainkit test: all checks passed; distributed training works with this configuration."


def check_processes(accelerator: Any) -> None:
    """Every process takes part in the collectives, with the right rank."""
    import torch

    ranks = accelerator.gather(torch.tensor([accelerator.process_index], device=accelerator.device))
    assert ranks.tolist() == list(range(accelerator.num_processes)), f"gather of the ranks gave {ranks.tolist()}"
    total = accelerator.reduce(torch.tensor(1.0, device=accelerator.device), reduction="sum")
    assert int(total.item()) == accelerator.num_processes, f"sum of ones gave {total.item()}"


def check_training(accelerator: Any) -> None:
    """Each process reads its own batches; after a few steps the weights agree on every process."""
    import torch

    torch.manual_seed(0)
    inputs = torch.randn(16 * accelerator.num_processes, 4)
    data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = []
    for features, target in loader:
        seen.append(features)
        loss = torch.nn.functional.mse_loss(model(features).float(), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    everything = accelerator.gather(torch.cat(seen))
    assert everything.shape[0] == inputs.shape[0], f"the processes read {everything.shape[0]} of {inputs.shape[0]} rows"
    weights = accelerator.unwrap_model(model).weight.detach().reshape(1, -1)
    gathered = accelerator.gather(weights)
    assert torch.allclose(gathered, gathered[:1].expand_as(gathered)), "the processes' weights differ after training"


def main() -> None:
    """Run the checks with the launch config the launcher handed over."""
    from trainkit.engine import Accelerator

    accelerator = Accelerator()
    accelerator.print(f"trainkit test: {accelerator.num_processes} process(es), device {accelerator.device}, "
                      f"distributed type {accelerator.distributed_type.value}, mixed precision {accelerator.mixed_precision}")
    check_processes(accelerator)
    check_training(accelerator)
    accelerator.wait_for_everyone()
    accelerator.print(SUCCESS)


if __name__ == "__main__":
    main()
