"""2-process check of the ddp_* fields (run under torchrun by test_argument_wiring.py): ``fields_worker.py OUT``.

Each rank writes what its DDP wrapper and process group received, the process attributes scripts read, and
its final weights.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from tests.trainer.helpers import IndexDataset
from trainkit import Trainer, TrainingArguments


class HalfUsed(nn.Module):
    """One parameter never takes part in the loss: DDP needs find_unused_parameters=True."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(1))
        self.unused = nn.Linear(1, 1)

    def forward(self, x, labels=None):
        prediction = x.squeeze(-1) + self.offset
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def main(out: str) -> None:
    args = TrainingArguments(
        output_dir=out, use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no", max_steps=3,
        per_device_train_batch_size=2, learning_rate=0.1, ddp_find_unused_parameters=True, ddp_bucket_cap_mb=5,
        ddp_broadcast_buffers=False, ddp_timeout=123, ddp_backend="gloo",
    )
    facts = {"process_index": args.process_index, "world_size": args.world_size,
             "parallel_mode": args.parallel_mode.value, "should_log": args.should_log, "should_save": args.should_save}
    trainer = Trainer(model=HalfUsed(), args=args, train_dataset=IndexDataset(12, shift=1.0))
    facts["global_step"] = trainer.train().global_step
    wrapped = trainer.model_wrapped
    facts["ddp"] = {"find_unused_parameters": wrapped.find_unused_parameters,
                    "bucket_bytes_cap": wrapped.bucket_bytes_cap, "broadcast_buffers": wrapped.broadcast_buffers}
    facts["timeout_s"] = trainer.accelerator.state.timeout.total_seconds()
    facts["backend"] = dist.get_backend()
    facts["weights"] = trainer.model.offset.tolist()
    args.eval_use_gather_object, args.per_device_eval_batch_size = True, 2
    predictions = trainer.predict(IndexDataset(13)).predictions  # 13 samples: the last global batch is padded
    facts["gathered_objects"] = [float(p) for p in predictions]
    with open(os.path.join(out, f"rank{args.process_index}.json"), "w") as handle:
        json.dump(facts, handle)


if __name__ == "__main__":
    main(sys.argv[1])
