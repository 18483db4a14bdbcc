"""A model transformers sharded while loading it (from_pretrained(distributed_config=...)) under trainkit (CPU, gloo).

Modes: ``sharded PRETRAINED OUT`` (4 processes: DistributedConfig(tp_size=2, fsdp_size=2) where the installed
transformers composes the two, else DistributedConfig(fsdp_size=4); see :func:`loading_layout`) and ``single
PRETRAINED OUT`` (one plain process, the reference). Each: the Trainer trains the loaded model (no
parallelism_config given: it follows the model's layout), saves it with save_model, and reports the per-step loss and gradient norm;
the sharded mode first checks that an Accelerator whose data layout differs from the model's refuses it, saves a
Trainer checkpoint after SAVE_AT steps, and at the end resumes it with a fresh model and Trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from nd_launched import SAVE_AT, Samples  # noqa: E402
from nd_parallel import ACCUMULATION, CLIP, GLOBAL, LR, STEPS  # noqa: E402


def loading_layout() -> dict:
    """What the installed transformers shards on 4 processes. Releases whose DistributedConfig has
    ``dp_replicate_size`` build one (pp, dp_replicate, fsdp, tp) mesh and compose TP with FSDP: TP2 x FSDP2.
    Earlier 5.x (5.17) apply tp_size or fsdp_size, not both (TP alone on 2 of the 4 processes): FSDP over all 4."""
    from transformers import DistributedConfig

    if "dp_replicate_size" in DistributedConfig.__dataclass_fields__:
        return dict(tp_size=2, fsdp_size=2)
    return dict(fsdp_size=4)


def main(mode: str, pretrained: str, out: Path) -> None:
    from transformers import DistributedConfig, LlamaForCausalLM

    from trainkit import Accelerator

    results: dict = {}
    if mode == "sharded":
        config = DistributedConfig(**loading_layout())
        model = LlamaForCausalLM.from_pretrained(pretrained, distributed_config=config)
        try:
            Accelerator().prepare(model)  # plain DDP over 4 processes would read 4 different batches
        except ValueError as error:
            results["refusal"] = str(error)
        Accelerator().free_memory()
        model = LlamaForCausalLM.from_pretrained(pretrained, distributed_config=config)
        data_parallel = 4 // config.tp_size
    else:
        model = LlamaForCausalLM.from_pretrained(pretrained)
        data_parallel = 1
    ids_before = {name: id(param) for name, param in model.named_parameters()}
    # the sharded run also saves a Trainer checkpoint after SAVE_AT of its STEPS steps (the resume leg reads it)
    trainer = _trainer(model, out / f"trainer_{mode}", data_parallel, save=mode == "sharded")
    trainer.train()
    trainer.save_model(str(out / f"saved_{mode}"))
    results.update(_logged(trainer), layout=trainer.accelerator.parallel_dims.describe()
                   if trainer.accelerator.parallel_dims else "one",
                   same_parameters=ids_before == {name: id(param) for name, param in trainer.model.named_parameters()})
    if mode == "sharded":  # a fresh model and Trainer resume from the checkpoint and finish the run
        model = LlamaForCausalLM.from_pretrained(pretrained, distributed_config=config)
        resumed = _trainer(model, out / "trainer_sharded", data_parallel, save=False)
        resumed.train(resume_from_checkpoint=str(out / "trainer_sharded" / f"checkpoint-{SAVE_AT}"))
        resumed.save_model(str(out / "saved_resumed"))
        results["resumed"] = _logged(resumed)
    if trainer.accelerator.is_main_process:
        torch.save(results, out / f"pretrained_{mode}.pt")


def _trainer(model: Any, output_dir: Path, data_parallel: int, save: bool) -> Any:
    from trainkit import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=GLOBAL // data_parallel,
        gradient_accumulation_steps=ACCUMULATION, max_grad_norm=CLIP, learning_rate=LR, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="steps" if save else "no", save_steps=SAVE_AT,
        report_to="none", use_cpu=True, seed=0, train_sampling_strategy="sequential", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Samples(GLOBAL * ACCUMULATION * STEPS))


def _logged(trainer: Any) -> dict:
    """The per-step loss and gradient norm the Trainer logged (a resumed one's history starts with the
    checkpoint's entries)."""
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {"losses": [entry["loss"] for entry in logs], "norms": [entry["grad_norm"] for entry in logs],
            "steps": [entry["step"] for entry in logs]}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
