"""Every foundation claim of the engine, run in real processes; results written to OUT for the test to compare.

Run as ``python engine_checks.py OUT`` (one process) or under torchrun with 2 gloo ranks. Rank 0 also
trains the same model with a hand-written PyTorch loop (one process, the whole global batch), which
is the reference the Accelerator runs must reproduce.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit import Accelerator, DataLoaderConfiguration
from trainkit.utils import set_seed

OUT = Path(sys.argv[1])
DATA_SEED = 123
GLOBAL_BATCH = 8


def dataset(size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, 6, generator=generator)
    y = x @ torch.linspace(-1, 1, 6)[:, None] + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(x, y)


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def reference(size: int, epochs: int = 2) -> dict[str, torch.Tensor]:
    """A plain PyTorch loop: one process, global batch of 8, the same shuffling order.

    A short last batch's loss counts for its share of a full batch: accumulation divides every micro-batch's
    loss by the number of steps, also in the short last window (Accelerate's rule).
    """
    data, net = dataset(size), model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for epoch in range(epochs):
        order = torch.randperm(size, generator=torch.Generator().manual_seed(DATA_SEED + epoch)).tolist()
        for start in range(0, size, GLOBAL_BATCH):
            x, y = data[order[start : start + GLOBAL_BATCH]]
            loss = nn.functional.mse_loss(net(x), y) * len(x) / GLOBAL_BATCH
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def with_accelerator(size: int, per_rank_batch: int, accumulation: int, epochs: int = 2) -> tuple[Accelerator, nn.Module]:
    accelerator = Accelerator(gradient_accumulation_steps=accumulation,
                              dataloader_config=DataLoaderConfiguration(data_seed=DATA_SEED, use_seedable_sampler=True))
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    loader = DataLoader(dataset(size), batch_size=per_rank_batch, shuffle=True)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(net):
                accelerator.backward(nn.functional.mse_loss(net(x), y))
                optimizer.step()
                optimizer.zero_grad()
    return accelerator, net


def training_runs(world: int) -> dict[str, dict[str, torch.Tensor]]:
    """Global batch 8 in every run: per-rank batch x processes x accumulation steps."""
    accelerator, ddp = with_accelerator(32, GLOBAL_BATCH // world, 1)
    accelerator.save_model(ddp, OUT / "saved_model")
    runs = {"ddp_b4_k1_n32": accelerator.get_state_dict(ddp)}
    # 36 samples: the last global batch holds 4, so the last accumulation window is short.
    for per_rank in (2, 1):
        steps = GLOBAL_BATCH // (per_rank * world)
        accelerator, net = with_accelerator(36, per_rank, steps)
        runs[f"acc_b{per_rank}_k{steps}_n36"] = accelerator.get_state_dict(net)
    return runs


def gather_checks(accelerator: Accelerator) -> dict:
    results = {}
    for size in (13, 7, 1):
        for split in (False, True):
            config = DataLoaderConfiguration(split_batches=split)
            acc = Accelerator(dataloader_config=config)
            loader = acc.prepare(DataLoader(TensorDataset(torch.arange(size)), batch_size=4))
            seen = [acc.gather_for_metrics(batch[0]) for batch in loader]
            objects = [x for batch in acc.prepare(DataLoader(list(range(size)), batch_size=2, collate_fn=list))
                       for x in acc.gather_for_metrics(batch, use_gather_object=True)]
            results[f"n{size}_split{int(split)}"] = {"tensors": torch.cat(seen).tolist(), "objects": objects,
                                                     "len": len(loader), "dataset_len": len(loader.dataset)}
    return results


def collective_checks(acc: Accelerator) -> dict:
    rank, world = acc.process_index, acc.num_processes
    ragged = torch.arange(rank + 2, dtype=torch.float32)
    padded = acc.pad_across_processes(ragged, pad_index=-1)
    padded_first = acc.pad_across_processes(ragged[None], dim=1, pad_index=-1, pad_first=True)
    broadcast = torch.tensor([float(rank)])
    from trainkit.engine.process import collectives

    collectives.broadcast(broadcast, from_process=world - 1)
    with acc.split_between_processes(list(range(5))) as mine:
        split = acc.gather_for_metrics(list(mine), use_gather_object=True) if world > 1 else list(mine)
    with acc.split_between_processes(list(range(5)), apply_padding=True) as mine:
        padded_split = len(mine)
    with acc.split_between_processes({"a": torch.arange(4), "b": ["w", "x", "y", "z"]}) as mine:
        dict_split = {"a": mine["a"].tolist(), "b": mine["b"]}
    if rank == world - 1:
        acc.set_trigger()
    trigger = acc.check_trigger()
    trigger_again = acc.check_trigger()
    marker = OUT / "main_first.txt"
    with acc.main_process_first():
        if acc.is_main_process:
            marker.write_text("main was here")
        main_first = marker.exists()
    main_only = acc.on_main_process(lambda: "ran")()
    nested = acc.gather({"x": torch.tensor([rank]), "y": [torch.tensor([[rank, rank]])]})
    acc.wait_for_everyone()
    return {
        "gather": acc.gather(torch.tensor([rank, rank * 10])).tolist(),
        "gather_scalar": acc.gather(torch.tensor(rank)).tolist(),
        "gather_nested": {"x": nested["x"].tolist(), "y": nested["y"][0].tolist()},
        "gather_object": acc.gather_for_metrics([f"r{rank}"], use_gather_object=True),
        "reduce_sum": acc.reduce(torch.tensor([rank + 1.0])).tolist(),
        "reduce_mean": acc.reduce(torch.tensor([rank + 1.0]), reduction="mean").tolist(),
        "padded": padded.tolist(),
        "padded_first": padded_first.tolist(),
        "broadcast": broadcast.tolist(),
        "split": split,
        "padded_split_len": padded_split,
        "dict_split": dict_split,
        "trigger": [trigger, trigger_again],
        "main_first": main_first,
        "main_only": main_only,
        "shared_state": Accelerator().state.__dict__ is acc.state.__dict__,
    }


def precision_checks() -> dict:
    """bf16 and fp16 train on CPU; an fp16 overflow skips the step and does not advance the scheduler."""
    results = {}
    for mode in ("bf16", "fp16"):
        acc = Accelerator(mixed_precision=mode)
        net = model()
        before = [p.detach().clone() for p in net.parameters()]
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        loader = DataLoader(dataset(32), batch_size=4)
        net, optimizer, loader, scheduler = acc.prepare(net, optimizer, loader, scheduler)
        losses, output_dtypes = [], set()
        for x, y in loader:
            out = net(x)
            output_dtypes.add(str(out.dtype))
            loss = nn.functional.mse_loss(out, y)
            acc.backward(loss)
            acc.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        result = {"losses": losses, "changed": any(not torch.equal(a, b.detach().cpu()) for a, b in zip(before, net.parameters())),
                  "output_dtypes": sorted(output_dtypes), "scheduler_epoch": scheduler.last_epoch,
                  "has_scaler": acc.scaler is not None}
        if mode == "fp16":
            weights = [p.detach().clone() for p in net.parameters()]
            epoch = scheduler.last_epoch
            x, y = next(iter(loader))
            acc.backward(nn.functional.mse_loss(net(x), y) * float("inf"))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            result["overflow_skipped"] = acc.optimizer_step_was_skipped
            result["overflow_weights_unchanged"] = all(torch.equal(a, b.detach()) for a, b in zip(weights, net.parameters()))
            result["overflow_scheduler_unchanged"] = scheduler.last_epoch == epoch
        results[mode] = result
    return results


def data_checks(acc: Accelerator) -> dict:
    # set_epoch(0) replays epoch 0's order: the seedable sampler's promise (a user's generator only moves on).
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(32)), batch_size=4, shuffle=True))
    full = [b[0].tolist() for b in loader]
    loader.set_epoch(0)
    skipped = [b[0].tolist() for b in acc.skip_first_batches(loader, 2)]
    epoch1 = [b[0].tolist() for b in loader]
    everyone = acc.gather(torch.tensor(full).flatten())
    return {"full": full, "skipped": skipped, "next_epoch_differs": epoch1 != full, "len": len(loader),
            "epoch_covers_dataset": sorted(everyone.tolist()) == list(range(32))}


def main() -> None:
    set_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    acc = Accelerator()
    world = acc.num_processes
    runs = training_runs(world)
    report = {
        "world": world,
        "distributed_type": acc.distributed_type.value,
        "collectives": collective_checks(acc),
        "gather_for_metrics": gather_checks(acc),
        "precision": precision_checks(),
        "data": data_checks(acc),
        "scheduler_steps": scheduler_steps(),
    }
    if acc.is_main_process:
        for name, state in runs.items():
            save_file({k: v.contiguous() for k, v in state.items()}, OUT / f"{name}.safetensors")
        save_file(reference(32), OUT / "reference_n32.safetensors")
        save_file(reference(36), OUT / "reference_n36.safetensors")
    (OUT / f"report_rank{acc.process_index}.json").write_text(json.dumps(report, indent=1))
    acc.wait_for_everyone()


def scheduler_steps() -> dict:
    """The schedule advances once per process per optimizer step, and not inside accumulation windows."""
    acc = Accelerator(gradient_accumulation_steps=2)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loader = DataLoader(dataset(48), batch_size=4)  # 12 batches -> 12 / world per rank -> / 2 windows
    net, optimizer, loader, scheduler = acc.prepare(net, optimizer, loader, scheduler)
    optimizer_steps = 0
    for x, y in loader:
        with acc.accumulate(net):
            acc.backward(nn.functional.mse_loss(net(x), y))
            optimizer.step()
            scheduler.step()
            optimizer_steps += int(acc.sync_gradients)
            optimizer.zero_grad()
    return {"optimizer_steps": optimizer_steps, "scheduler_steps": scheduler.last_epoch}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
