"""Sequence (Ulysses) and context (ring) parallelism on 4 gloo processes (CPU) against one process.

Modes (argv[1]):
* ``layouts OUT`` (torchrun, 4 processes): a tiny Llama (GQA: 4 heads, 2 key/value heads), sequences of
  SEQ tokens, trained for STEPS optimizer steps (accumulation 2, clipping 1.0, AdamW, fp32) with an
  ``Accelerator`` loop under SP2 x FSDP2, SP2 x TP2 and CP2 x FSDP2, and SP2 x FSDP2 saving a sharded (DCP)
  checkpoint after SAVE_AT steps; SP2 x FSDP2's checkpoint is then resumed under CP2 x FSDP2 and under SP2 x TP2.
  Rank 0 computes the reference: the same model, data and optimizer in one process with plain torch.
  CP runs torch's ring attention (``_templated_ring_attention``, load-balanced, both rotate methods) with SDPA's
  CPU kernel in place of the CUDA ones it dispatches to (registered as the CPU ring kernel: see
  ``cpu_ring_attention``); everything around it is trainkit's: the head-tail cut, positions, labels, loss.
* ``launched OUT`` (``trainkit launch --config_file`` with a ``parallelism_config:`` block saying FSDP2 and
  ``--parallelism_config_sp_size 2`` on the command line): ``Accelerator()`` (no arguments) under the launcher's
  layout, then a ``Trainer`` with ``TrainingArguments(parallelism_config=SP2 x FSDP2)`` on padded rows of
  different lengths (items differ per rank and per micro-batch), and the same Trainer under SP4.
* ``single OUT`` (one plain process): the Trainer reference (no ParallelismConfig), and SP2 x FSDP2's checkpoint
  resumed on this one process.
* ``gpu OUT`` (torchrun, 2 processes with a GPU each, NCCL): CP2 with torch's own ring attention on CUDA kernels
  (both ``cp_comm_strategy`` values) and SP2, against the one-process reference on the GPU.
* ``gpu_kernel OUT`` (torchrun, 1 process, one GPU): trainkit's call into torch's ring attention on a 1-rank mesh
  against SDPA, forward and gradients, fp32 and bf16.
Each writes ``OUT/<mode>.pt`` on its main process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

from trainkit import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

VOCAB, SEQ, GLOBAL, STEPS, ACCUMULATION, CLIP, LR, SAVE_AT = 128, 258, 4, 4, 2, 1.0, 1e-3, 2
"""SEQ = 258: not a multiple of 2 x cp (the ring's layout pads it to 260); the last label of each row is -100, so
the two halves of a sequence hold different numbers of labelled tokens."""
LAYOUTS = {
    "sp2_fsdp2": dict(dp_shard_size=2, sp_size=2),
    "sp2_tp2": dict(sp_size=2, tp_size=2),
    "sp2_ddp2": dict(dp_replicate_size=2, sp_size=2),
    "cp2_fsdp2": dict(dp_shard_size=2, cp_size=2),
    "cp2_fsdp2_alltoall": dict(dp_shard_size=2, cp_size=2, cp_handler={"cp_comm_strategy": "alltoall"}),
    "cp2_tp2": dict(cp_size=2, tp_size=2),
}
CHECKPOINTED = {"sp2_tp2", "cp2_tp2"}
"""Layouts run with activation checkpointing (attention recomputed in backward, its collectives with it)."""
SHARDED = "SHARDED_STATE_DICT"


def build_model() -> LlamaForCausalLM:
    """The same tiny Llama on every rank: 4 query heads, 2 key/value heads (under SP2 x TP2 each rank has one
    key/value head, repeated for its sp rank)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randint(0, VOCAB, (samples, SEQ), generator=generator))


def reference(device: str = "cpu") -> dict:
    """One process, plain torch: micro-batches of GLOBAL samples, loss / ACCUMULATION, clip, AdamW."""
    model = build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for index, (ids,) in enumerate(DataLoader(dataset(GLOBAL * ACCUMULATION * STEPS), batch_size=GLOBAL)):
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        (loss / ACCUMULATION).backward()
        losses.append(float(loss))
        if (index + 1) % ACCUMULATION == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        model.eval()
        ids = dataset(4).tensors[0].to(device)
        evaluated = float(model(input_ids=ids, labels=ids).loss)
    return {"losses": losses, "norms": norms, "eval": evaluated,
            "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}


def accelerator_run(accelerator: Accelerator, *, save_to: Path | None = None, resume: Path | None = None) -> dict:
    """Train to STEPS optimizer steps (from SAVE_AT when resuming); per-micro-batch loss (the same on every
    rank of a sequence group), per-step gradient norm, final full parameters, and an evaluation loss."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(dataset(GLOBAL * ACCUMULATION * STEPS), batch_size=GLOBAL // accelerator.strategy.data_parallel_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    first = 0
    if resume is not None:
        accelerator.load_state(str(resume))
        first = SAVE_AT
        loader = accelerator.skip_first_batches(loader, first * ACCUMULATION)
    losses, norms = [], []
    for index, (ids,) in enumerate(loader, start=first * ACCUMULATION):
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
        if save_to is not None and index + 1 == SAVE_AT * ACCUMULATION:
            accelerator.save_state(str(save_to))
    model.eval()  # evaluation: whole sequences on every rank, the model's own attention
    with torch.no_grad():
        ids = dataset(4).tensors[0].to(accelerator.device)
        evaluated = float(model(input_ids=ids, labels=ids).loss)
    from torch.distributed.tensor.experimental._attention import _cp_options

    dims = accelerator.parallel_dims
    params = {name: tensor.cpu() for name, tensor in accelerator.get_state_dict(model).items()}
    return {"losses": losses, "norms": norms, "params": params, "eval": evaluated,
            "layout": dims.describe() if dims is not None else "one process",
            "attention": model.config._attn_implementation, "rotate_method": _cp_options.rotate_method.name}


def cpu_ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float | None,
                       mesh) -> torch.Tensor:
    """torch's ring attention algorithm (forward and backward, head-tail load balancing, the rotate method set by
    ``cp_comm_strategy``) with SDPA's CPU flash kernel as its block kernel: the test double for the CUDA kernels
    torch's context-parallel dispatch needs."""
    return _CpuRing.apply(query, key, value, mesh.get_group(), scale)


class _CpuRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, group, scale):  # type: ignore[override]
        from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

        def block(query, key, value, is_causal, **_):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, bool(is_causal),
                                                                              scale=scale)

        output, lse = _templated_ring_attention(group, 2, block, query, key, value, is_causal=True)[:2]
        ctx.save_for_backward(query, key, value, output, lse)
        ctx.group, ctx.scale = group, scale
        return output

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention_backward

        query, key, value, output, lse = ctx.saved_tensors

        def block(query, key, value, out, logsumexp, is_causal, grad_out, **_):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out, query, key, value, out, logsumexp, 0.0, bool(is_causal), scale=ctx.scale)

        grads = _templated_ring_attention_backward(ctx.group, 2, block, grad_out=grad.contiguous(), grad_out_name="grad_out",
                                                   query=query, key=key, value=value, out=output, logsumexp=lse,
                                                   is_causal=True)
        return grads[0], grads[1], grads[2], None, None


class Rows(Dataset):
    """Trainer samples: token rows right-padded to SEQ after 200 to 258 tokens (labels -100 and attention mask 0
    on the padding), so micro-batches and sequence halves hold different numbers of labelled tokens; whole rows
    with ``padded=False`` (evaluation: data-parallel ranks then average equal token counts, as one process)."""

    def __init__(self, samples: int, padded: bool = True) -> None:
        self.ids = dataset(samples).tensors[0]
        self.lengths = (torch.randint(200, SEQ + 1, (samples,), generator=torch.Generator().manual_seed(7)) if padded
                        else torch.full((samples,), SEQ))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        mask = (torch.arange(SEQ) < self.lengths[index]).long()
        return {"input_ids": self.ids[index] * mask, "attention_mask": mask,
                "labels": self.ids[index].masked_fill(mask == 0, -100)}


def trainer_run(out: Path, parallelism: ParallelismConfig | None, data_parallel: int) -> dict:
    from trainkit import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=GLOBAL // data_parallel,
        gradient_accumulation_steps=ACCUMULATION, max_grad_norm=CLIP, learning_rate=LR, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
        parallelism_config=parallelism, train_sampling_strategy="sequential", disable_tqdm=True,
        per_device_eval_batch_size=2)  # whole batches on every data-parallel rank: the mean of batch means is exact
    trainer = Trainer(model=build_model(), args=args, train_dataset=Rows(GLOBAL * ACCUMULATION * STEPS),
                      eval_dataset=Rows(8, padded=False))
    trainer.train()
    metrics = trainer.evaluate()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    dims = trainer.accelerator.parallel_dims
    return {"losses": [entry["loss"] for entry in logs], "norms": [entry["grad_norm"] for entry in logs],
            "params": trainer.accelerator.get_state_dict(trainer.model), "eval_loss": metrics["eval_loss"],
            "layout": dims.describe() if dims is not None else "one process"}


def sharded_fsdp(checkpointed: bool = False) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(state_dict_type=SHARDED, activation_checkpointing=checkpointed)


def ring_on_cpu() -> dict:
    """What torch's own context parallelism does on CPU (``context_parallel`` around SDPA on a 4-rank cp mesh),
    and what trainkit says before a CPU ring kernel is registered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    found: dict = {}
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("cp",))
    query, key, value = (torch.randn(1, 2, 16, 8) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        with context_parallel(mesh, buffers=[query, key, value], buffer_seq_dims=[2, 2, 2],
                              no_restore_buffers={query, key, value}):
            torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        found["torch"] = "ran"
    except Exception as error:  # the finding: which error torch raises
        found["torch"] = f"{type(error).__name__}: {error}"
    finally:  # torch 2.11 leaves SDPA patched when the body raises (2.13 restores it)
        torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))
        found["trainkit"] = "accepted"
    except Exception as error:
        found["trainkit"] = f"{type(error).__name__}: {error}"
    return found


def torch_ring_on_one_gpu() -> dict:
    """torch's ring attention through trainkit's kernel on a 1-rank cp mesh (one GPU) against SDPA: forward and
    gradients, fp32 and bf16 (the ring with one rank is one block: this checks torch's dispatch path runs)."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainkit.engine.parallel import ring

    ring.enable_torch_ring("allgather")
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("cp",))
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        tensors = [torch.randn(2, 4, 256, 32, device="cuda", dtype=dtype) for _ in range(3)]
        weights = torch.randn(2, 4, 256, 32, device="cuda", dtype=dtype)
        grads = []
        for attention in ("sdpa", "ring"):
            inputs = [tensor.clone().requires_grad_() for tensor in tensors]
            output = (torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=True) if attention == "sdpa"
                      else ring.torch_ring_attention(*inputs, scale=None, mesh=mesh))
            (output.float() * weights).sum().backward()
            grads.append([output.detach().float()] + [tensor.grad.float() for tensor in inputs])
        errors[str(dtype)] = max(float((ring_ - sdpa).norm() / sdpa.norm()) for sdpa, ring_ in zip(*grads))
    return errors


def main(mode: str, out: Path) -> None:
    from trainkit.engine.parallel import ring

    results: dict = {}
    if mode == "layouts":
        results["ring_on_cpu"] = ring_on_cpu()
    if mode in ("layouts", "launched", "single"):
        ring.RING_KERNELS["cpu"] = cpu_ring_attention  # torch's ring algorithm with the CPU block kernel
    if mode == "layouts":
        for name, layout in LAYOUTS.items():
            accelerator = Accelerator(parallelism_config=ParallelismConfig(**layout),
                                      fsdp_plugin=sharded_fsdp(name in CHECKPOINTED),
                                      gradient_accumulation_steps=ACCUMULATION)
            results[name] = accelerator_run(accelerator, save_to=out / "sp2_fsdp2_checkpoint"
                                            if name == "sp2_fsdp2" else None)
        for name in ("cp2_fsdp2", "sp2_tp2"):
            accelerator = Accelerator(parallelism_config=ParallelismConfig(**LAYOUTS[name]), fsdp_plugin=sharded_fsdp(),
                                      gradient_accumulation_steps=ACCUMULATION)
            results[f"resumed_{name}"] = accelerator_run(accelerator, resume=out / "sp2_fsdp2_checkpoint")
        if Accelerator().is_main_process:
            results["reference"] = reference()
    elif mode == "launched":
        results["accelerator"] = accelerator_run(Accelerator(gradient_accumulation_steps=ACCUMULATION))
        results["trainer"] = trainer_run(out, ParallelismConfig(dp_shard_size=2, sp_size=2), data_parallel=2)
        results["trainer_sp4"] = trainer_run(out, ParallelismConfig(sp_size=4), data_parallel=1)
    elif mode == "single":
        results["trainer"] = trainer_run(out, None, data_parallel=1)
        results["resumed"] = accelerator_run(Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION),
                                             resume=out / "sp2_fsdp2_checkpoint")
    elif mode == "gpu":  # 2 processes, one GPU each: torch's own ring attention (CUDA kernels), NCCL
        for name in ("cp2", "cp2_alltoall", "sp2"):
            layout = dict(cp_size=2) if name.startswith("cp") else dict(sp_size=2)
            if name == "cp2_alltoall":
                layout["cp_handler"] = {"cp_comm_strategy": "alltoall"}
            accelerator = Accelerator(parallelism_config=ParallelismConfig(**layout),
                                      gradient_accumulation_steps=ACCUMULATION)
            results[name] = accelerator_run(accelerator)
        if Accelerator().is_main_process:
            results["reference"] = reference("cuda")
    elif mode == "gpu_kernel":  # 1 process, one GPU
        results["errors"] = torch_ring_on_one_gpu()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if Accelerator().is_main_process:
        torch.save(results, out / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
