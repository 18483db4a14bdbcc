"""``cpu_ram_efficient_loading`` with a real ``from_pretrained`` on 2 gloo ranks, as scripts are written.

``MODE=launch``: started by ``trainkit launch`` with an FSDP config that sets the option; the script calls
``from_pretrained(..., dtype=torch.bfloat16)`` *before* ``Accelerator()`` (a conversion that makes
transformers read every weight). ``MODE=trainer``: plain torchrun; ``TrainingArguments(fsdp=...,
fsdp_config={"cpu_ram_efficient_loading": True})`` comes first, then ``from_pretrained``, then ``Trainer``.
``MODE=deepspeed``: plain torchrun; ``Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero3_init_flag=True))``
comes first, then ``from_pretrained``.

``python ... MODE CHECKPOINT OUT``; rank 0 writes ``OUT/pretrained_<MODE>.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from fsdp_common import gather_floats, write_results
from transformers import GPT2LMHeadModel

MODE, CHECKPOINT, OUT = sys.argv[1], sys.argv[2], Path(sys.argv[3])
BATCH = {"input_ids": torch.arange(24).reshape(2, 12) % 1001, "labels": torch.arange(24).reshape(2, 12) % 1001}


def load() -> tuple[GPT2LMHeadModel, bool]:
    """The model as the script loads it, and whether it came on the meta device (no weights read)."""
    model = GPT2LMHeadModel.from_pretrained(CHECKPOINT, dtype=torch.bfloat16)
    return model, all(p.is_meta for p in model.parameters())


def state_difference(full: dict[str, torch.Tensor]) -> float:
    """Largest difference between the gathered weights and the checkpoint read directly (bf16)."""
    expected = GPT2LMHeadModel.from_pretrained(CHECKPOINT, dtype=torch.bfloat16).state_dict()
    return max(float((full[name].float().cpu() - tensor.float()).abs().max()) for name, tensor in expected.items())


def launched(accelerator_first: bool) -> dict[str, object]:
    """The Accelerate path: the launcher's config (model loaded first), or a DeepSpeed plugin built first."""
    from trainkit import Accelerator, DeepSpeedPlugin

    def make_accelerator() -> Accelerator:
        if accelerator_first:  # zero3_init_flag runs as cpu_ram_efficient_loading (docs/deepspeed.md)
            return Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True))
        return Accelerator()

    accelerator = make_accelerator() if accelerator_first else None
    model, on_meta = load()
    accelerator = accelerator or make_accelerator()
    prepared = accelerator.prepare(model)
    full = accelerator.get_state_dict(prepared)
    with torch.no_grad():
        loss = float(prepared(**BATCH).loss)
    # prepare() restored from_pretrained: this reference is real on every rank.
    reference = GPT2LMHeadModel.from_pretrained(CHECKPOINT, dtype=torch.bfloat16)
    with torch.no_grad():
        reference_loss = float(reference(**BATCH).loss)
    entry = dict(built_on_meta=gather_floats(float(on_meta)),
                 reference_real=gather_floats(float(not any(p.is_meta for p in reference.parameters()))),
                 loss_diff=max(gather_floats(abs(loss - reference_loss))),
                 tied=gather_floats(float(prepared.lm_head.weight is prepared.transformer.wte.weight)),
                 fsdp_loading=accelerator.strategy.options.cpu_ram_efficient_loading)
    if accelerator.is_main_process:
        entry["state_diff"] = state_difference(full)
    return entry


def trained() -> dict[str, object]:
    """The Trainer path, against the same run with every rank loading real weights."""
    efficient, on_meta = train_with_trainer(efficient=True)
    reference, _ = train_with_trainer(efficient=False)
    return {"built_on_meta": gather_floats(float(on_meta)), "losses": efficient, "reference_losses": reference}


def train_with_trainer(efficient: bool) -> tuple[list[float], bool]:
    from datasets import Dataset

    from trainkit import Trainer, TrainingArguments

    fsdp_config = {"cpu_ram_efficient_loading": efficient, "transformer_layer_cls_to_wrap": ["GPT2Block"]}
    args = TrainingArguments(output_dir=str(OUT / "trainer"), fsdp="full_shard auto_wrap", fsdp_config=fsdp_config,
                             max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3, report_to=[],
                             save_strategy="no", use_cpu=True, logging_steps=1, seed=0)
    model, on_meta = load()
    data = Dataset.from_dict({key: value.tolist() * 6 for key, value in BATCH.items()})
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log], on_meta


if __name__ == "__main__":
    results = trained() if MODE == "trainer" else launched(accelerator_first=MODE == "deepspeed")
    write_results(OUT, f"pretrained_{MODE}", results)
