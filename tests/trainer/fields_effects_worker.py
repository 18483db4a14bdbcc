"""2 processes (torchrun, gloo on CPU) for the field proofs of test_field_effects.py: ``fields_effects_worker.py OUT``.

One launch, several short runs; each rank writes ``OUT/rank<N>.json`` with what torch and the model saw:
- the process group's timeout (ddp_timeout, set by the first run, which builds the process group);
- the DistributedDataParallel wrapper's settings (ddp_*), on a model with a parameter no loss uses;
- the final weights with average_tokens_across_devices True and False (TokenDataset's samples hide different
  numbers of labels, so the two ranks count different items);
- the rows of each batch the model saw with accelerator_config={"split_batches": True};
- whether the parameters are sharded DTensors (parallelism_config, fsdp) and the files of an FSDP checkpoint
  (fsdp_config's state_dict_type).
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from tests.trainer.checkpoint_workload import make_trainer
from tests.trainer.helpers import IndexDataset, TinyTokenModel, TokenDataset, accumulation_args
from trainkit import ParallelismConfig, Trainer, TrainingArguments

OUT = sys.argv[1]
facts: dict = {}


class HalfUsed(nn.Module):
    """One parameter never takes part in the loss: DDP needs find_unused_parameters=True."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(1))
        self.unused = nn.Linear(1, 1)
        self.rows: list[int] = []

    def forward(self, x, labels=None):
        self.rows.append(len(x))
        prediction = x.squeeze(-1) + self.offset
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def ddp_run() -> None:
    args = TrainingArguments(
        output_dir=os.path.join(OUT, "ddp"), use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
        max_steps=2, per_device_train_batch_size=2, learning_rate=0.1, ddp_timeout=123,
        ddp_find_unused_parameters=True, ddp_bucket_cap_mb=5, ddp_broadcast_buffers=False, ddp_static_graph=True)
    trainer = Trainer(model=HalfUsed(), args=args, train_dataset=IndexDataset(12, shift=1.0))
    trainer.train()
    wrapped = trainer.model_wrapped
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    facts["timeout_s"] = backend.options._timeout.total_seconds()
    facts["ddp"] = {"type": type(wrapped).__name__, "find_unused_parameters": wrapped.find_unused_parameters,
                    "bucket_bytes_cap": wrapped.bucket_bytes_cap, "broadcast_buffers": wrapped.broadcast_buffers,
                    "static_graph": wrapped.static_graph}


def average_tokens_runs() -> None:
    for name, across in (("across", True), ("local", False)):
        torch.manual_seed(0)
        args = accumulation_args(os.path.join(OUT, name), batch=2, steps=2, max_steps=2,
                                 average_tokens_across_devices=across)
        trainer = Trainer(model=TinyTokenModel(), args=args, train_dataset=TokenDataset(16))
        trainer.train()
        state = {k: v.detach().cpu().clone().contiguous()
                 for k, v in trainer.accelerator.get_state_dict(trainer.model_wrapped).items()}
        if trainer.is_world_process_zero():
            save_file(state, os.path.join(OUT, f"{name}.safetensors"))


def split_batches_run() -> None:
    model = HalfUsed()
    model.unused.requires_grad_(False)
    args = TrainingArguments(output_dir=os.path.join(OUT, "split"), use_cpu=True, report_to="none", disable_tqdm=True,
                             save_strategy="no", max_steps=2, per_device_train_batch_size=4,
                             accelerator_config={"split_batches": True})
    Trainer(model=model, args=args, train_dataset=IndexDataset(16)).train()
    facts["batch_rows"] = model.rows


def sharded(params) -> dict:
    params = list(params)
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return {"all_dtensor": all(isinstance(p, DTensor) for p in params),
            "local_fraction": local / sum(p.numel() for p in params)}


def parallelism_run() -> None:
    trainer = make_trainer(os.path.join(OUT, "parallelism"), max_steps=1, save_strategy="no", eval_strategy="no",
                           parallelism_config=ParallelismConfig(dp_shard_size=2))
    trainer.train()
    facts["parallelism"] = sharded(trainer.model_wrapped.parameters())


def fsdp_run() -> None:
    folder = os.path.join(OUT, "fsdp")
    trainer = make_trainer(folder, max_steps=1, save_strategy="steps", eval_strategy="no", fsdp="full_shard",
                           fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})
    trainer.train()
    facts["fsdp"] = sharded(trainer.model_wrapped.parameters())
    facts["fsdp"]["checkpoint_files"] = sorted(os.listdir(os.path.join(folder, "checkpoint-1")))


ddp_run()  # first: it builds the process group, with its timeout
average_tokens_runs()
split_batches_run()
parallelism_run()
fsdp_run()
with open(os.path.join(OUT, f"rank{dist.get_rank()}.json"), "w") as handle:
    json.dump(facts, handle)
