"""2 processes on 2 GPUs for the ddp_backend proof of test_field_effects.py: ``fields_backend_worker.py OUT``.

A Trainer with ddp_backend='gloo' where the device would pick nccl; each rank writes the backend torch built."""

import json
import os
import sys

import torch.distributed as dist

from tests.trainer.checkpoint_workload import make_trainer

trainer = make_trainer(os.path.join(sys.argv[1], "run"), max_steps=1, save_strategy="no", eval_strategy="no",
                       ddp_backend="gloo")
trainer.train()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as handle:
    json.dump({"backend": dist.get_backend()}, handle)
