"""An Accelerate-style loop with ``accelerator.check_preemption()``, run by `trainkit launch --max_restarts 1`.

``preemption_loop.py WORK_DIR``: 2 gloo processes, 40 SGD steps over one epoch (30 ms each). In the first
attempt rank 1 sends itself SIGTERM after step 5 (only that worker is signalled); every rank must stop at the same step,
save_state() and exit 75; torchrun restarts the group, which load_state()s the newest checkpoint and finishes.
Then, in the same processes, an uninterrupted run from scratch gives the reference. Rank 0 prints
``REPORT {...}`` with the step resumed from and whether the final weights equal the reference bitwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator
from trainkit.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

STEPS = 40
STEP_SECONDS = 0.03


class StepCounter:
    """Checkpointed with the rest of the state: the step the loop reached."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def run(project_dir: str, signal_at: int | None) -> tuple[dict[str, torch.Tensor], int]:
    """Train to STEPS (resuming from project_dir's newest checkpoint if any); return weights and the start step."""
    set_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8 * STEPS, 4, generator=generator)
    dataset = TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    # use_stateful_dataloader: load_state continues at the exact next batch (Accelerate's default restores the
    # epoch only and leaves skipping to the script).
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    counter = StepCounter()
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                                   DataLoader(dataset, batch_size=4, shuffle=True))
    accelerator.register_for_checkpointing(counter)
    if os.path.isdir(os.path.join(project_dir, "checkpoints")):
        accelerator.load_state()  # the newest complete checkpoint
    started_at = counter.step
    for inputs, targets in loader:
        time.sleep(STEP_SECONDS)  # stands in for real compute: the agreement runs about every 0.5 s
        loss = ((model(inputs).squeeze(-1) - targets) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        counter.step += 1
        if counter.step == signal_at and accelerator.process_index == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        accelerator.check_preemption()
        if counter.step == STEPS:
            break
    accelerator.end_training()
    weights = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return weights, started_at


def main() -> None:
    work = sys.argv[1]
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    resumed, started_at = run(os.path.join(work, "run"), signal_at=5 if first_attempt else None)
    reference, _ = run(os.path.join(work, "reference"), signal_at=None)
    if int(os.environ.get("RANK", "0")) == 0:
        equal = all(torch.equal(resumed[name], reference[name]) for name in reference)
        print("REPORT " + json.dumps({"rank": 0, "started_at": started_at, "bitwise_equal": equal}), flush=True)


if __name__ == "__main__":
    main()
