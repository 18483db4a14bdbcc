"""2-process run for test_field_effects.py (torchrun, gloo on CPU): ``fields_effects_worker.py OUT``.

TinyTokenModel on TokenDataset, whose samples hide different numbers of labels, so the two ranks count
different items: trained with average_tokens_across_devices=True (the default: the mean over every item of
both ranks) and False (each rank's own mean, then the mean of the two). Rank 0 writes both final weights.
"""

import os
import sys

import torch
from safetensors.torch import save_file

from tests.trainer.helpers import TinyTokenModel, TokenDataset, accumulation_args
from trainkit import Trainer

OUT = sys.argv[1]

for name, across in (("across", True), ("local", False)):
    torch.manual_seed(0)
    model = TinyTokenModel()
    args = accumulation_args(os.path.join(OUT, name), batch=2, steps=2, max_steps=2,
                             average_tokens_across_devices=across)
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(16))
    trainer.train()
    state = {k: v.detach().cpu().clone().contiguous() for k, v in trainer.accelerator.get_state_dict(trainer.model_wrapped).items()}
    if trainer.is_world_process_zero():
        save_file(state, os.path.join(OUT, f"{name}.safetensors"))
