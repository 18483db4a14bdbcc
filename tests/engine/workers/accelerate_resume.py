"""Resume the way Accelerate scripts resume, and load_state for every optimizer and object; one launch, many checks.

Run as one process or under torchrun (gloo, CPU), plain or with ``--fsdp`` (FSDP2). Rank 0 writes
``OUT/results.json``; the assertions live in tests/engine/checkpoint/test_accelerate_resume.py.

Scenarios, each against an uninterrupted run of the same loop (dropout, shuffling, a scheduler):
- ``step``: the loop of Accelerate's ``examples/by_feature/checkpointing.py``: ``save_state("step_N")`` inside
  the loop; then a fresh model, optimizer, loader and seed, ``load_state``, ``starting_epoch = N // len(loader)``
  and ``skip_first_batches(loader, N % len(loader))``. N mid-epoch and N at an epoch's last batch.
- ``epoch``: ``save_state("epoch_0")`` after the first epoch; the resumed loop starts at epoch 1.
- ``stateful``: ``DataLoaderConfiguration(use_stateful_dataloader=True)``: no ``skip_first_batches``, the
  loader resumes mid-epoch by itself.
- ``objects``: two models, plain SGD (stepped; no state at all), Adam never stepped, a registered object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainkit import Accelerator
from trainkit.utils import set_seed
from trainkit.utils.dataclasses import DataLoaderConfiguration

NUM_SAMPLES, FEATURES, PER_RANK_BATCH, EPOCHS = 40, 6, 4, 3


class Samples(Dataset):
    """Fixed regression data that also returns each sample's index (to record the order)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(NUM_SAMPLES, FEATURES, generator=generator)
        self.y = torch.randn(NUM_SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int):
        return self.x[index], self.y[index], index


class Counter:
    """A user's own object registered for checkpointing."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = int(state["value"])


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))


def make_accelerator(args: argparse.Namespace, stateful: bool = False) -> Accelerator:
    kwargs = {}
    if args.fsdp:
        from trainkit import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(state_dict_type=args.fsdp)
    return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful), **kwargs)


def setup(args: argparse.Namespace, seed: int, stateful: bool = False):
    """What an Accelerate script builds before its loop (the seed decides weights and the shuffling order)."""
    set_seed(seed)
    accelerator = make_accelerator(args, stateful)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(Samples(), batch_size=PER_RANK_BATCH, shuffle=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.05 * step))
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def full_weights(accelerator: Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return float("inf")
    # Empty on ranks other than 0 under FSDP (full state dicts gather to rank 0); only rank 0 reports.
    return max(((x.float() - y.float()).abs().max().item() for x, y in zip(a.values(), (b[k] for k in a))), default=0.0)


def train(accelerator, model, optimizer, loader, scheduler, *, starting_epoch=0, active=None, overall_step=0,
          save_at=None, save_dir=None):
    """Accelerate's example loop; returns the global sample indices consumed, step by step, and the last step."""
    order: dict[int, list[int]] = {}
    for epoch in range(starting_epoch, EPOCHS):
        model.train()
        batches = active if (active is not None and epoch == starting_epoch) else loader
        for x, y, index in batches:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            order[overall_step] = accelerator.gather(index).tolist()
            if save_at is not None and overall_step == save_at:
                accelerator.save_state(os.path.join(save_dir, f"step_{overall_step}"))
        if save_at == "epoch" and epoch == 0:
            accelerator.save_state(os.path.join(save_dir, f"epoch_{epoch}"))
    return order, overall_step


def resume_scenario(args: argparse.Namespace, kind: str, save_at: int | str, work: Path) -> dict:
    """Uninterrupted run (saving at ``save_at``), then a fresh, differently seeded run resumed from that save."""
    stateful = kind == "stateful"
    accelerator, model, optimizer, loader, scheduler = setup(args, seed=11, stateful=stateful)
    folder = work / f"{kind}_{save_at}"
    reference_order, _ = train(accelerator, model, optimizer, loader, scheduler, save_at=save_at, save_dir=str(folder))
    reference = full_weights(accelerator, model)

    accelerator, model, optimizer, loader, scheduler = setup(args, seed=999, stateful=stateful)
    length_before = len(loader)
    name = f"epoch_0" if save_at == "epoch" else f"step_{save_at}"
    accelerator.load_state(str(folder / name))
    length_after = len(loader)
    # The script's own arithmetic, as in Accelerate's examples/by_feature/checkpointing.py:
    if save_at == "epoch":
        starting_epoch, resume_step, active = 1, 0, None
    else:
        resume_step = int(save_at)
        starting_epoch = resume_step // len(loader)
        resume_step -= starting_epoch * len(loader)
        active = loader if stateful else accelerator.skip_first_batches(loader, resume_step)
    skipped_length = len(active) if active is not None else None
    order, last_step = train(accelerator, model, optimizer, loader, scheduler, starting_epoch=starting_epoch,
                             active=active, overall_step=starting_epoch * len(loader) + resume_step)
    resumed = full_weights(accelerator, model)
    return {
        "len_before_load": length_before, "len_after_load": length_after, "len_after_training": len(loader),
        "skip_view_len": skipped_length, "starting_epoch": starting_epoch, "last_step": last_step,
        "reference_last_step": max(reference_order), "steps_resumed": len(order),
        "order_matches": all(order[step] == reference_order[step] for step in order),
        "max_weight_difference": max_difference(reference, resumed),
    }


def objects_scenario(args: argparse.Namespace, work: Path) -> dict:
    """Several models and optimizers, optimizers without state, a registered object: saved and loaded."""

    def build(seed: int):
        set_seed(seed)
        accelerator = make_accelerator(args)
        first, second = build_model(), build_model()
        sgd = torch.optim.SGD(first.parameters(), lr=0.1)  # no momentum: never any state
        adam = torch.optim.Adam(second.parameters(), lr=1e-3)  # not stepped before the save
        first, second, sgd, adam = accelerator.prepare(first, second, sgd, adam)
        counter = Counter()
        accelerator.register_for_checkpointing(counter)
        return accelerator, first, second, sgd, adam, counter

    accelerator, first, second, sgd, adam, counter = build(3)
    x = torch.randn(8, FEATURES, generator=torch.Generator().manual_seed(accelerator.process_index))
    accelerator.backward(first(x).pow(2).mean())
    sgd.step()
    sgd.zero_grad()
    sgd.optimizer.param_groups[0]["lr"] = 0.05  # a changed hyper-parameter must come back
    counter.value = 42
    folder = work / "objects"
    accelerator.save_state(str(folder))
    saved = {"first": full_weights(accelerator, first), "second": full_weights(accelerator, second)}

    loaded_acc, loaded_first, loaded_second, loaded_sgd, loaded_adam, loaded_counter = build(4)
    loaded_acc.load_state(str(folder))
    result = {
        "first_difference": max_difference(saved["first"], full_weights(loaded_acc, loaded_first)),
        "second_difference": max_difference(saved["second"], full_weights(loaded_acc, loaded_second)),
        "sgd_state_empty": len(loaded_sgd.optimizer.state) == 0, "sgd_lr": loaded_sgd.optimizer.param_groups[0]["lr"],
        "adam_state_empty": len(loaded_adam.optimizer.state) == 0, "counter": loaded_counter.value,
    }
    # Both Adams take their first step from the same weights with the same gradient (no dropout): identical results.
    for acc, model, optimizer in ((accelerator, second, adam), (loaded_acc, loaded_second, loaded_adam)):
        model.eval()
        acc.backward(model(x).pow(2).mean())
        optimizer.step()
    result["adam_first_step_difference"] = max_difference(full_weights(accelerator, second),
                                                          full_weights(loaded_acc, loaded_second))
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fsdp", default=None, help="SHARDED_STATE_DICT or FULL_STATE_DICT")
    args = parser.parse_args()
    work = Path(args.out) / "checkpoints"
    probe = make_accelerator(args)
    steps_per_epoch = NUM_SAMPLES // (PER_RANK_BATCH * probe.num_processes)
    results = {"world_size": probe.num_processes, "steps_per_epoch": steps_per_epoch,
               "step_mid_epoch": resume_scenario(args, "step", steps_per_epoch + steps_per_epoch // 2, work),
               "step_epoch_end": resume_scenario(args, "step", steps_per_epoch, work),
               "epoch": resume_scenario(args, "epoch", "epoch", work),
               "stateful": resume_scenario(args, "stateful", steps_per_epoch + steps_per_epoch // 2, work),
               "objects": objects_scenario(args, work)}
    if probe.is_main_process:
        (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))
    probe.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
