"""The N-D layouts through the public entry points, and checkpoints across layouts (CPU, gloo).

Modes (argv[1]):
* ``launched OUT``: started by ``trainkit launch --config_file`` whose ``parallelism_config:`` block says
  TP2 x FSDP2 (with FSDP options: sharded DCP checkpoints; gradient_accumulation_steps 2). ``Accelerator()`` (no
  arguments) trains the tiny Llama of nd_parallel.py, saving its state after SAVE_AT optimizer steps; then a
  ``Trainer`` with ``TrainingArguments(parallelism_config=...)`` trains it under TP2 x FSDP2, TP2 x DDP2 and
  HSDP 2x2 (the arguments win over the launcher's block).
* ``single OUT``: one plain process: the same Accelerator loop (no checkpoint) and the same Trainer without a
  ParallelismConfig (the references), then the TP2 x FSDP2 checkpoint resumed on this one process.
* ``relaunched OUT``: started by ``trainkit launch --config_file`` whose block says TP2 x DDP2 (MULTI_CPU, no
  FSDP options): ``Accelerator()`` trains under it; then the checkpoint is resumed under FSDP4 (which saves its
  own sharded checkpoint one step later), under DDP over the 4 processes, and the FSDP4 checkpoint resumed back
  under TP2 x FSDP2 (each given as ``Accelerator(parallelism_config=...)``).
Each writes ``OUT/<mode>.pt`` on its main process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
from nd_parallel import ACCUMULATION, CLIP, GLOBAL, LR, STEPS, build_model, dataset, micro_step  # noqa: E402

from trainkit import Accelerator, ParallelismConfig  # noqa: E402

SAVE_AT = 2
TP2_FSDP2 = dict(dp_shard_size=2, tp_size=2)
TRAINER_LAYOUTS = {"trainer": (TP2_FSDP2, 2), "trainer_tp2_ddp2": (dict(dp_replicate_size=2, tp_size=2), 2),
                   "trainer_hsdp2x2": (dict(dp_replicate_size=2, dp_shard_size=2), 4)}
"""Trainer runs of the ``launched`` mode: name -> (ParallelismConfig fields, data-parallel degree)."""


def accelerator_run(accelerator: Accelerator, save_to: Path | None, *, resume: Path | None = None,
                    resumed_at: int = SAVE_AT, save_after: int = SAVE_AT) -> dict:
    """Train up to STEPS optimizer steps (from ``resumed_at`` when resuming ``resume``); with ``save_to``, save
    there after ``save_after`` steps."""
    model = build_model(tied=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    per_rank = GLOBAL // accelerator.strategy.data_parallel_size
    loader = DataLoader(dataset(GLOBAL * ACCUMULATION * STEPS), batch_size=per_rank)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loaded = None
    first = 0
    if resume is not None:
        accelerator.load_state(str(resume))
        loaded = {name: tensor.clone() for name, tensor in accelerator.get_state_dict(model).items()}  # not views
        first = resumed_at
        loader = accelerator.skip_first_batches(loader, first * ACCUMULATION)
    losses, norms = [], []
    for index, (ids,) in enumerate(loader, start=first * ACCUMULATION):
        losses.append(micro_step(accelerator, model, optimizer, ids, norms))
        if save_to is not None and (index + 1) == save_after * ACCUMULATION:
            accelerator.save_state(str(save_to))
    return {"losses": losses, "norms": norms, "params": accelerator.get_state_dict(model), "loaded": loaded,
            "layout": accelerator.parallel_dims.describe() if accelerator.parallel_dims else "one process",
            "distributed_type": accelerator.distributed_type.value}


class Samples(Dataset):
    """The same token rows as ``dataset``, as the Trainer's dict samples (labels = inputs)."""

    def __init__(self, samples: int) -> None:
        self.ids = dataset(samples).tensors[0]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def trainer_run(out: Path, parallelism: ParallelismConfig | None, data_parallel: int) -> dict:
    from trainkit import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=GLOBAL // data_parallel,
        gradient_accumulation_steps=ACCUMULATION, max_grad_norm=CLIP, learning_rate=LR, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
        parallelism_config=parallelism, train_sampling_strategy="sequential", disable_tqdm=True)
    trainer = Trainer(model=build_model(tied=False), args=args, train_dataset=Samples(GLOBAL * ACCUMULATION * STEPS))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {"losses": [entry["loss"] for entry in logs], "norms": [entry["grad_norm"] for entry in logs],
            "params": trainer.accelerator.get_state_dict(trainer.model),
            "layout": trainer.accelerator.parallel_dims.describe() if trainer.accelerator.parallel_dims else "one"}


def main(mode: str, out: Path) -> None:
    results: dict = {}
    if mode == "launched":
        results["accelerator"] = accelerator_run(Accelerator(), out / "tp2_fsdp2_checkpoint")
        for name, (layout, data_parallel) in TRAINER_LAYOUTS.items():
            results[name] = trainer_run(out, ParallelismConfig(**layout), data_parallel=data_parallel)
    elif mode == "single":
        results["accelerator"] = accelerator_run(Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION), None)
        results["trainer"] = trainer_run(out, None, data_parallel=1)
        results["resumed"] = accelerator_run(Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION), None,
                                             resume=out / "tp2_fsdp2_checkpoint")
    elif mode == "relaunched":
        from trainkit import FullyShardedDataParallelPlugin

        results["accelerator"] = accelerator_run(Accelerator(gradient_accumulation_steps=ACCUMULATION), None)

        sharded = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
        accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=4), fsdp_plugin=sharded,
                                  gradient_accumulation_steps=ACCUMULATION)
        results["resumed"] = accelerator_run(accelerator, out / "fsdp4_checkpoint", resume=out / "tp2_fsdp2_checkpoint",
                                             save_after=SAVE_AT + 1)
        # DDP over the 4 processes: replication alone (an Accelerator() here would take the launcher's block)
        ddp = Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=4),
                          gradient_accumulation_steps=ACCUMULATION)
        results["resumed_ddp"] = accelerator_run(ddp, None, resume=out / "tp2_fsdp2_checkpoint")
        back = Accelerator(parallelism_config=ParallelismConfig(**TP2_FSDP2), gradient_accumulation_steps=ACCUMULATION)
        results["back_to_tp"] = accelerator_run(back, None, resume=out / "fsdp4_checkpoint", resumed_at=SAVE_AT + 1)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if Accelerator().is_main_process:
        torch.save(results, out / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
