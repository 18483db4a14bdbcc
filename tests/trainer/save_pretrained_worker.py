"""``Trainer.save_model`` of a transformers model under DDP or FSDP2 (torchrun, CPU, gloo).

``python -m torch.distributed.run --nproc_per_node 2 save_pretrained_worker.py {ddp|fsdp} OUT``: rank 0 first
writes the reference, ``save_pretrained`` of the model as built; then every rank builds a Trainer around the same
model (sharded across the ranks under FSDP2) and calls ``save_model(OUT/trainer)``.
tests/trainer/test_save_pretrained.py compares the two folders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from trainkit import Trainer, TrainingArguments


def tiny_vit():
    """A ViT image classifier: transformers 5 renames its weights inside the model (``vit.layers.0.attention
    .k_proj``) and ``save_pretrained`` writes the checkpoint names (``vit.encoder.layer.0.attention.attention.key``)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                       image_size=8, patch_size=4, num_labels=3)
    return ViTForImageClassification(config)


def main(kind: str, out: Path) -> None:
    model = tiny_vit()
    strategy = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"min_num_params": 100}} if kind == "fsdp" else {}
    trainer = Trainer(model=model, args=TrainingArguments(str(out / "run"), report_to="none", use_cpu=True, **strategy))
    if trainer.is_world_process_zero():
        model.save_pretrained(out / "reference")  # before the engine shards it
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(out / "trainer"))
    sharded = any(type(p).__name__ == "DTensor" for p in trainer.model_wrapped.parameters())
    if trainer.is_world_process_zero():
        (out / "sharded.txt").write_text(str(sharded))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
