"""Shared pieces of the FSDP workers: a tiny BERT, deterministic per-rank batches, one training run.

Every run trains the same 2-layer BertForSequenceClassification (built from a config, no download)
for a fixed number of steps on batches that depend only on (step, rank), so DDP and each FSDP
strategy see identical data and their per-step losses can be compared rank by rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification

from trainkit import Accelerator

VOCAB, SEQ, BATCH = 256, 16, 4
BERT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def build_bert(seed: int = 0, device: str | None = None) -> BertForSequenceClassification:
    """The test model; identical on every rank for the same seed (or on the meta device)."""
    torch.manual_seed(seed)
    config = BertConfig(**BERT)
    if device == "meta":
        with torch.device("meta"):
            return BertForSequenceClassification(config)
    return BertForSequenceClassification(config)


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    """This rank's batch for ``step`` (the same for every strategy)."""
    generator = torch.Generator().manual_seed(10_000 * rank + step)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator),
            "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
            "labels": torch.randint(0, 2, (BATCH,), generator=generator)}


@dataclass
class Run:
    """What one training run produced on this rank."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    accelerator: Any = None
    model: Any = None
    optimizer: Any = None


def train(make_accelerator: Callable[[], Accelerator], *, steps: int = 20, optimizer_before: bool = True,
          clip: float | None = None, model: Any = None, lr: float = 1e-3) -> Run:
    """Train for ``steps`` optimizer steps (micro-batches = steps x accumulation) and record losses."""
    accelerator = make_accelerator()
    model = model if model is not None else build_bert()
    if optimizer_before:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=lr))
    run = Run(accelerator=accelerator, model=model, optimizer=optimizer)
    rank = accelerator.process_index
    micro_steps = steps * accelerator.gradient_accumulation_steps
    for step in range(micro_steps):
        with accelerator.accumulate(model):
            data = {k: v.to(accelerator.device) for k, v in batch(step, rank).items()}
            loss = model(**data).loss
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                run.grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
            optimizer.step()
            optimizer.zero_grad()
        run.losses.append(float(loss.detach()))
    return run


def max_difference(a: list[float], b: list[float]) -> float:
    """Largest absolute per-step difference (inf when the lengths differ)."""
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def state_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute element difference between two full state dicts (inf when keys differ)."""
    if set(a) != set(b):
        return float("inf")
    return max((float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) if a[k].numel() else 0.0)
               for k in a)


def update_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> float:
    """How far run ``a``'s update (final - initial weights) is from run ``b``'s, relative to ``b``'s, in L2 norm:
    0 for the same training, 1 for a run that never stepped."""
    if set(a) != set(b):
        return float("inf")
    def update(state: dict[str, torch.Tensor], key: str) -> torch.Tensor:
        return state[key].float().cpu() - initial[key].float().cpu()
    difference = sum(float((update(a, k) - update(b, k)).pow(2).sum()) for k in b if k in initial)
    return (difference / sum(float(update(b, k).pow(2).sum()) for k in b if k in initial)) ** 0.5


def write_results(out: Path, name: str, results: dict[str, Any]) -> None:
    """Rank 0 writes ``name``.json for the pytest side to assert on; every rank waits for it."""
    if int(os.environ.get("RANK", "0")) == 0:
        (out / f"{name}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    if dist.is_initialized():
        dist.barrier()


def gather_floats(value: float) -> list[float]:
    """``value`` from every rank (rank order)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def flatten_optimizer_state(state: dict) -> dict[str, torch.Tensor]:
    """``{"name/key": tensor}`` for every tensor of a full optimizer state dict (for safetensors)."""
    flat = {}
    for name, values in state["state"].items():
        for key, value in values.items():
            flat[f"{name}/{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return flat
