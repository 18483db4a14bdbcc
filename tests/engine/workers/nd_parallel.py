"""N-D parallel runs on 4 gloo processes (CPU) against a hand-written one-process loop.

Each layout (TP2 x FSDP2, TP2 x DDP2, HSDP 2x2) trains a tiny Llama (tied and untied embeddings, fp32) for
STEPS optimizer steps with accumulation 2 and clipping 1.0 on a prepared DataLoader (global batch GLOBAL), then
evaluates with ``gather_for_metrics``; TP2 x FSDP2 and HSDP 2x2 also train in bf16. Started by ``trainkit launch
--config_file`` whose ``parallelism_config:`` block says HSDP 2x2, one more untied fp32 run takes its layout
from the block (``Accelerator()`` given no ParallelismConfig; the others name theirs, which wins). Rank 0 runs
the reference: the same model, data and optimizer in one process with plain torch, no trainkit. Everything is
written to ``<out>/results.pt`` for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

from trainkit import Accelerator, ParallelismConfig

VOCAB, SEQ, GLOBAL, STEPS, ACCUMULATION, CLIP, LR = 64, 8, 4, 4, 2, 1.0, 1e-2
LAYOUTS = {
    "tp2_fsdp2": dict(dp_shard_size=2, tp_size=2),
    "tp2_ddp2": dict(dp_replicate_size=2, tp_size=2),
    "hsdp2x2": dict(dp_replicate_size=2, dp_shard_size=2),
}


def build_model(tied: bool) -> LlamaForCausalLM:
    """The same tiny Llama on every rank (4 heads, 2 KV heads: both split over TP=2)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randint(0, VOCAB, (samples, SEQ), generator=generator))


def per_sample_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none")
    return losses.view(ids.shape[0], -1).mean(dim=1)


def reference(tied: bool) -> dict:
    """One process, plain torch: micro-batches of GLOBAL samples, loss / ACCUMULATION, clip, AdamW."""
    model = build_model(tied)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(dataset(GLOBAL * ACCUMULATION * STEPS), batch_size=GLOBAL)
    losses, norms = [], []
    for index, (ids,) in enumerate(loader):
        loss = model(input_ids=ids, labels=ids).loss
        (loss / ACCUMULATION).backward()
        losses.append(float(loss))
        if (index + 1) % ACCUMULATION == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        evaluated = per_sample_loss(model, dataset(10).tensors[0])
    return {"losses": losses, "norms": norms, "params": {k: v.clone() for k, v in model.state_dict().items()},
            "eval": evaluated}


def micro_step(accelerator: Accelerator, model, optimizer, ids: torch.Tensor, norms: list[float]) -> float:
    """One micro-batch through the Accelerator (accumulation, clipping at the window's end, appended to
    ``norms``); returns the loss averaged over the processes."""
    with accelerator.accumulate(model):
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
    return float(accelerator.reduce(loss.detach(), "mean"))


def distributed(layout: dict | None, tied: bool, mixed_precision: str = "no") -> dict:
    """One run under ``layout`` (None: the launcher's ``parallelism_config:`` block, ``Accelerator()`` not told)."""
    parallelism = ParallelismConfig(**layout) if layout is not None else None
    accelerator = Accelerator(parallelism_config=parallelism, gradient_accumulation_steps=ACCUMULATION,
                              mixed_precision=mixed_precision)
    dims = accelerator.parallel_dims
    model = build_model(tied)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(dataset(GLOBAL * ACCUMULATION * STEPS), batch_size=GLOBAL // dims.dp_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, norms = [], []
    for (ids,) in loader:
        losses.append(micro_step(accelerator, model, optimizer, ids, norms))
    eval_loader = accelerator.prepare(DataLoader(dataset(10), batch_size=2))
    gathered = []
    with torch.no_grad():
        for (ids,) in eval_loader:
            gathered.append(accelerator.gather_for_metrics(per_sample_loss(model, ids)))
    params = accelerator.get_state_dict(model)
    return {"losses": losses, "norms": norms, "params": params, "eval": torch.cat(gathered),
            "mesh": dims.describe(), "tp_rank": accelerator.tensor_parallel_rank,
            "local_numel": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                               for p in model.parameters())}


def main(out: Path) -> None:
    results: dict = {}
    for tied in (False, True):
        name = "tied" if tied else "untied"
        for layout_name, layout in LAYOUTS.items():
            results[f"{layout_name}/{name}"] = distributed(layout, tied)
        accelerator = Accelerator()
        if accelerator.is_main_process:
            results[f"reference/{name}"] = reference(tied)
        accelerator.wait_for_everyone()
    results["launcher_block/untied"] = distributed(None, tied=False)  # the launch YAML's block: HSDP 2x2
    for layout_name in ("tp2_fsdp2", "hsdp2x2"):  # bf16: FSDP2's policy plus autocast, with and without TP
        results[f"{layout_name}/bf16"] = distributed(LAYOUTS[layout_name], tied=False, mixed_precision="bf16")
    results["initial/untied"] = build_model(False).state_dict()  # the bf16 test measures each run's update from it
    if Accelerator().is_main_process:
        torch.save(results, out / "results.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
