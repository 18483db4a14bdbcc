"""What the Trainer builds itself for a plain ``nn.Module`` run, compared with what transformers builds (CPU only).

A Trainer run of a plain module with torch's optimizers, the everyday schedules and dict-of-tensor batches does not
import transformers (its package alone takes ~0.3 s to import). Each piece built here instead is compared with the
installed transformers' own: optimizer classes and keywords, schedule rates and states, collated batches, the
accelerator_config class, the memory tracker's methods and the workers' seeds. One subprocess checks the import.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from transformers import Trainer as TransformersTrainer
from transformers.data.data_collator import default_data_collator
from transformers.optimization import get_scheduler
from transformers.trainer_pt_utils import AcceleratorConfig as TransformersAcceleratorConfig
from transformers.trainer_utils import TrainerMemoryTracker
from transformers.trainer_utils import seed_worker as transformers_seed_worker

from tests.distributed import REPO, worker_env
from trainkit import TrainingArguments
from trainkit.trainer import data, loaders, memory, optim, saving, schedules
from trainkit.trainer.training_arguments.accelerator_config import AcceleratorConfig


def _args(tmp_path, **fields) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)


def test_a_plain_module_run_does_not_import_transformers():
    script = textwrap.dedent("""
        import sys, tempfile, torch
        from trainkit import Trainer, TrainingArguments

        class Rows(torch.utils.data.Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return {"x": torch.full((2,), float(i)), "labels": torch.tensor(float(i))}

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)
            def forward(self, x, labels):
                return {"loss": ((self.layer(x).squeeze(-1) - labels) ** 2).mean()}

        for optim in ("adamw_torch_fused", "sgd"):
            args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4,
                                     use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
                                     optim=optim, lr_scheduler_type="cosine", warmup_steps=1,
                                     accelerator_config={"even_batches": True})
            trainer = Trainer(model=Model(), args=args, train_dataset=Rows(), eval_dataset=Rows())
            trainer.train()
            trainer.evaluate()
            trainer.save_model()
        print("IMPORTED", sorted({name.split(".")[0] for name in sys.modules} & {"transformers", "datasets", "pandas"}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=worker_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IMPORTED []" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("name", sorted(optim.BUILT_WITH_TORCH))
def test_torch_optimizers_resolve_as_transformers_trainer_does(name, tmp_path):
    assert name in optim.optimizer_names()
    args = _args(tmp_path, optim=name, learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-7)
    model = nn.Linear(3, 2)
    theirs = TransformersTrainer.get_optimizer_cls_and_kwargs(optim._ResolverArguments(args, None), model)
    assert optim.optimizer_cls_and_kwargs(args, model) == theirs


def test_optim_args_go_to_transformers(tmp_path):
    args = _args(tmp_path, optim="sgd", optim_args="momentum=0.5,nesterov=true")  # read or not: the release decides
    theirs = TransformersTrainer.get_optimizer_cls_and_kwargs(optim._ResolverArguments(args, args.optim_args))
    assert optim.optimizer_cls_and_kwargs(args) == theirs


def _rates(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("name", schedules.BUILT_HERE)
@pytest.mark.parametrize("warmup, total", [(0, 10), (3, 10), (0.25, 7), (10, 10), (12, 10), (0, 1)])
def test_everyday_schedules_are_transformers_schedules(name, warmup, total, tmp_path):
    assert name in schedules.scheduler_names()
    args = _args(tmp_path, lr_scheduler_type=name, warmup_steps=warmup, learning_rate=0.1)
    ours = schedules.build_scheduler(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), args, total)
    theirs = get_scheduler(name, torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
                           num_warmup_steps=args.warmup_steps_for(total), num_training_steps=total)
    assert type(ours) is type(theirs)
    assert ours.state_dict() == theirs.state_dict()
    assert _rates(ours, total + 3) == _rates(theirs, total + 3)  # exact: the same float operations
    assert ours.state_dict() == theirs.state_dict()


def test_schedule_arguments_and_other_names_go_to_transformers(tmp_path):
    for fields in ({"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycles": 1.5}},
                   {"lr_scheduler_type": "polynomial", "lr_scheduler_kwargs": {"power": 2.0}},
                   {"lr_scheduler_type": "cosine_with_restarts"}):
        args = _args(tmp_path, warmup_steps=2, learning_rate=0.1, **fields)
        ours = schedules.build_scheduler(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), args, 9)
        theirs = get_scheduler(args.lr_scheduler_type, torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
                               num_warmup_steps=2, num_training_steps=9,
                               scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        assert _rates(ours, 12) == _rates(theirs, 12)


def test_names_are_checked_and_spelled_as_transformers_spells_them(tmp_path):
    assert _args(tmp_path, lr_scheduler_type="Cosine", optim="SGD").lr_scheduler_type == "cosine"
    assert _args(tmp_path, optim="SGD").optim == "sgd"
    with pytest.raises(ValueError, match="lr_scheduler_type.*cosine_with_restarts"):
        _args(tmp_path, lr_scheduler_type="cosine_with_restart")
    with pytest.raises(ValueError, match="optim"):
        _args(tmp_path, optim="adamw_torch_fuse")


@pytest.mark.parametrize("features", [
    [{"x": torch.randn(3), "labels": torch.tensor(1)}, {"x": torch.randn(3), "labels": torch.tensor(0)}],
    [{"pixel_values": torch.randn(1, 4, 4), "labels": torch.tensor(2.0)}] * 3,
    [{"x": torch.randn(2), "label": torch.tensor(1)}, {"x": torch.randn(2), "label": torch.tensor(0)}],
    [{"x": np.ones(2, dtype=np.float32), "label": 1}, {"x": np.zeros(2, dtype=np.float32), "label": 0}],
    [{"input_ids": [1, 2], "labels": 1, "text": "a"}, {"input_ids": [3, 4], "labels": 0, "text": "b"}],
])
def test_dict_batches_are_collated_as_default_data_collator_does(features):
    ours, theirs = data.collate_any(features), default_data_collator(features)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype
        assert torch.equal(ours[key], theirs[key])


def test_accelerator_config_has_transformers_fields_and_methods(tmp_path):
    def fields(cls):
        return [(f.name, f.default, f.default_factory) for f in dataclasses.fields(cls)]

    assert fields(AcceleratorConfig) == fields(TransformersAcceleratorConfig)
    public = {name for name in vars(TransformersAcceleratorConfig) if not name.startswith("_")}
    assert public <= set(vars(AcceleratorConfig))
    args = _args(tmp_path, accelerator_config=TransformersAcceleratorConfig(split_batches=True))
    assert isinstance(args.accelerator_config, AcceleratorConfig)
    assert args.accelerator_config.to_dict() == TransformersAcceleratorConfig(split_batches=True).to_dict()
    assert args.accelerator_config.pop("split_batches") is True
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps({"even_batches": False, "non_blocking": True}))
    assert AcceleratorConfig.from_json_file(path).to_dict() == \
        TransformersAcceleratorConfig.from_json_file(str(path)).to_dict()
    path.write_text(json.dumps({"even_batch": False}))
    with pytest.raises(ValueError, match="even_batch"):
        AcceleratorConfig.from_json_file(path)


def test_skipped_memory_metrics_answer_the_trackers_methods(tmp_path):
    skipped = memory.memory_tracker(_args(tmp_path))
    assert isinstance(skipped, memory.SkippedMemoryMetrics)
    theirs = TrainerMemoryTracker(skip_memory_metrics=True)
    for name in ("start", "stop", "update_metrics", "stop_and_update_metrics"):
        assert inspect.signature(getattr(skipped, name)).parameters.keys() == \
            inspect.signature(getattr(theirs, name)).parameters.keys()
    metrics = {"train_loss": 1.0}
    skipped.start(), theirs.start()
    skipped.stop_and_update_metrics(metrics), theirs.stop_and_update_metrics(metrics)
    assert metrics == {"train_loss": 1.0}
    assert isinstance(memory.memory_tracker(_args(tmp_path, skip_memory_metrics=False)), TrainerMemoryTracker)


def _draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_workers_are_seeded_as_transformers_seeds_them():
    torch.manual_seed(1234)
    loaders.seed_worker(0, num_workers=2, rank=3)
    ours = _draws()
    torch.manual_seed(1234)
    transformers_seed_worker(0, num_workers=2, rank=3)
    theirs = _draws()
    assert ours[:2] == theirs[:2] and torch.equal(ours[2], theirs[2])


def test_transformers_and_peft_models_are_told_from_plain_modules():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
    assert saving.is_pretrained(model) and not saving.is_pretrained(nn.Linear(2, 2))
    peft = pytest.importorskip("peft", reason="the PEFT case needs the optional peft package")
    assert saving.is_pretrained(peft.get_peft_model(model, peft.LoraConfig(target_modules=["c_attn"], fan_in_fan_out=True)))
