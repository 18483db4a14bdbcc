"""A Trainer script whose TrainingArguments set neither precision, accumulation, device nor FSDP: the
launcher's flags must reach the run; then a second Trainer sets accumulation explicitly (one notice)."""

import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from settings_common import build_model, observed, provenance, report  # noqa: E402

from trainkit import Trainer, TrainingArguments  # noqa: E402


class Ones(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.ones(8), "labels": torch.zeros(1)}


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_model()
        self._no_split_modules = ["BertLayer"]

    def forward(self, x, labels=None):
        out = self.net(x)
        self.resharded_after_forward = isinstance(self.net[0].linear.weight, DTensor)
        return {"loss": (out.float() - labels).pow(2).mean(), "logits": out}


def arguments(**kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=2, num_train_epochs=1,
                             report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, **kwargs)


model = Regression()
trainer = Trainer(model=model, args=arguments(), train_dataset=Ones())
trainer.train()
facts = observed(trainer.accelerator, model.net)
facts.update(optimizer_steps=trainer.state.global_step, resharded_after_forward=model.resharded_after_forward,
             gradient_accumulation_steps=trainer.accelerator.config.gradient_accumulation_steps,
             arguments_accumulation=trainer.args.gradient_accumulation_steps,
             engine_accumulation=trainer.accelerator.gradient_accumulation_steps)

explicit = Trainer(model=Regression(), args=arguments(gradient_accumulation_steps=2), train_dataset=Ones())
explicit.train()
facts["explicit"] = {"optimizer_steps": explicit.state.global_step,
                     "provenance": provenance(explicit.accelerator)}
report(facts)
