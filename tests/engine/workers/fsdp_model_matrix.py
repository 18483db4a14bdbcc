"""FSDP2 over real transformers architectures, one launch: every model x wrap policy x strategy against DDP.

Run under ``torch.distributed.run --nproc_per_node N fsdp_model_matrix.py OUT MODE``. MODE "two" (2 ranks):
FULL_SHARD and SHARD_GRAD_OP, reloads with ``from_pretrained`` / ``PeftModel.from_pretrained``,
``merge-weights`` output, save-then-load per ``state_dict_type``. MODE "hybrid" (4 ranks): HYBRID_SHARD.
MODE "one" (1 process): save-then-load only. Each check is recorded, error included, so one failure
does not hide the others; rank 0 writes ``OUT/matrix_MODE.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fsdp_common import gather_floats, max_difference, write_results
from fsdp_zoo import MIN_NUM_PARAMS, MODELS, batch, build, tied_pairs

from trainkit import Accelerator, FullyShardedDataParallelPlugin

OUT, MODE = Path(sys.argv[1]), sys.argv[2]
STEPS = 10
POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STRATEGIES = {"two": ("FULL_SHARD", "SHARD_GRAD_OP"), "hybrid": ("HYBRID_SHARD",), "one": ()}[MODE]
results: dict[str, Any] = {}


def fsdp_accelerator(**options: Any) -> Accelerator:
    options.setdefault("min_num_params", MIN_NUM_PARAMS)
    return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**options))


def train(name: str, accelerator: Accelerator, steps: int = STEPS, model: Any = None) -> dict[str, Any]:
    """Train ``name`` with the optimizer over its trainable parameters only; per-step losses."""
    model = model if model is not None else build(name)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for step in range(steps):
        data = {k: v.to(accelerator.device) for k, v in batch(name, step, accelerator.process_index).items()}
        loss = model(**data).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {"accelerator": accelerator, "model": model, "optimizer": optimizer, "losses": losses}


def recorded(key: str, check, *args: Any) -> None:
    """Run one check; record its result or its error (every rank runs every check, so collectives match)."""
    print(f"[rank {os.environ.get('RANK')}] {key}", file=sys.stderr, flush=True)
    try:
        results[key] = check(*args)
    except Exception as error:  # noqa: BLE001 - the pytest side reports it against this configuration
        results[key] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}


def matrix_entry(name: str, policy: str, strategy: str, reference: list[float]) -> dict[str, Any]:
    run = train(name, fsdp_accelerator(auto_wrap_policy=policy, sharding_strategy=strategy))
    entry: dict[str, Any] = {"loss_diff": max(gather_floats(max_difference(run["losses"], reference))),
                             "losses": run["losses"][:3]}
    model = run["model"]
    entry["trainable_in_optimizer"] = sum(len(g["params"]) for g in run["optimizer"].param_groups)
    entry["trainable"] = sum(1 for p in model.parameters() if p.requires_grad)
    entry["ties_kept"] = tied_pairs(model) == tied_pairs(build(name))
    if MODE == "two" and strategy == "FULL_SHARD":
        entry.update(reload_full_state(name, run))
    return entry


def reload_full_state(name: str, run: dict[str, Any]) -> dict[str, Any]:
    """Save the full state dict as users do (``save_pretrained(state_dict=...)``), reload it, compare."""
    accelerator, model = run["accelerator"], run["model"]
    full = accelerator.get_state_dict(model)  # every rank gathers; rank 0 keeps it
    entry: dict[str, Any] = {}
    if accelerator.is_main_process:
        with tempfile.TemporaryDirectory() as folder:
            accelerator.unwrap_model(model).save_pretrained(folder, state_dict=dict(full))  # save_pretrained empties the dict it is given
            entry = rank0_only(compare_reloaded, name, folder, full)
    accelerator.wait_for_everyone()
    return entry


def compare_reloaded(name: str, folder: str, full: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Reload from ``folder`` strictly and compare every tensor with ``full``; ties must survive."""
    if name == "lora":
        from peft import PeftModel

        reloaded = PeftModel.from_pretrained(build("llama_tied"), folder)
        missing: list[str] = []
        unexpected: list[str] = []
    else:
        cls = type(build(name))
        reloaded, info = cls.from_pretrained(folder, output_loading_info=True)
        missing, unexpected = list(info["missing_keys"]), list(info["unexpected_keys"])
        missing += list(info.get("mismatched_keys", []))
    state = reloaded.state_dict()
    compared = [key for key in full if key in state]
    difference = max((float((state[key].float() - full[key].float()).abs().max()) for key in compared), default=0.0)
    return {"reload_missing": missing, "reload_unexpected": unexpected, "reload_diff": difference,
            "reload_compared": len(compared), "reload_keys": len(full),
            "reload_ties_kept": tied_pairs(reloaded) == tied_pairs(build(name))}


def merged_weights_entry(name: str) -> dict[str, Any]:
    """SHARDED_STATE_DICT save_state -> ``trainkit merge-weights`` -> ``from_pretrained`` strictly."""
    run = train(name, fsdp_accelerator(auto_wrap_policy="SIZE_BASED_WRAP", state_dict_type="SHARDED_STATE_DICT"),
                steps=3)
    accelerator = run["accelerator"]
    full = accelerator.get_state_dict(run["model"])
    folder = tempfile.mkdtemp(prefix="merge-", dir=OUT) if accelerator.is_main_process else None
    folder = broadcast_text(folder)
    accelerator.save_state(f"{folder}/checkpoint")
    entry: dict[str, Any] = {}
    if accelerator.is_main_process:
        entry = rank0_only(merge_and_reload, name, folder, accelerator.unwrap_model(run["model"]), full)
    accelerator.wait_for_everyone()
    return entry


def merge_and_reload(name: str, folder: str, model: Any, full: dict[str, torch.Tensor]) -> dict[str, Any]:
    # The command as users run it: one plain process, outside the training job.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                                                      "GROUP_", "ROLE_", "TORCHELASTIC"))}
    subprocess.run([sys.executable, "-m", "trainkit.cli.main", "merge-weights", f"{folder}/checkpoint",
                    f"{folder}/merged"], check=True, env=env, capture_output=True, timeout=120)
    if name != "lora":
        model.config.save_pretrained(f"{folder}/merged")
    return compare_reloaded(name, f"{folder}/merged", full)


def rank0_only(check, *args: Any) -> dict[str, Any]:
    """A check only rank 0 runs: its error is recorded instead of leaving the other ranks waiting."""
    try:
        return check(*args)
    except Exception as error:  # noqa: BLE001
        return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}


def broadcast_text(text: str | None) -> str:
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [text]
        dist.broadcast_object_list(box, src=0)
        text = box[0]
    return str(text)


def save_then_load(state_dict_type: str) -> dict[str, Any]:
    """Train tied GPT-2, save_state, train on, load_state in the same process: weights and ties come back."""
    run = train("gpt2", fsdp_accelerator(auto_wrap_policy="SIZE_BASED_WRAP", state_dict_type=state_dict_type), steps=3)
    accelerator, model = run["accelerator"], run["model"]
    folder = broadcast_text(tempfile.mkdtemp(prefix="saveload-", dir=OUT) if accelerator.is_main_process else None)
    saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    accelerator.save_state(folder)
    for step in range(2):  # moves the weights away from the saved ones
        data = {k: v.to(accelerator.device) for k, v in batch("gpt2", step, accelerator.process_index).items()}
        accelerator.backward(model(**data).loss)
        run["optimizer"].step()
        run["optimizer"].zero_grad()
    accelerator.load_state(folder)
    loaded = accelerator.get_state_dict(model)
    entry: dict[str, Any] = {"ties_kept": model.lm_head.weight is model.transformer.wte.weight}
    if accelerator.is_main_process:
        entry["diff"] = max(float((loaded[k] - saved[k]).abs().max()) for k in saved)
        entry["keys_equal"] = set(loaded) == set(saved)
    data = {k: v.to(accelerator.device) for k, v in batch("gpt2", 99, accelerator.process_index).items()}
    entry["loss_after_load_finite"] = bool(torch.isfinite(model(**data).loss.detach()))
    return entry


def mixed_dtypes(reference: list[float]) -> dict[str, Any]:
    """Untied Llama with a bfloat16 head: prepared (the head is widened to float32) and trains like DDP."""
    model = build("llama_untied")
    model.lm_head.to(torch.bfloat16)
    run = train("llama_untied", fsdp_accelerator(auto_wrap_policy="TRANSFORMER_BASED_WRAP"), model=model)
    dtypes = sorted({str(p.dtype) for p in run["model"].parameters()})
    return {"loss_diff": max(gather_floats(max_difference(run["losses"], reference))), "dtypes": dtypes}


def meta_loading_tied(reference: list[float]) -> dict[str, Any]:
    """cpu_ram_efficient_loading on tied GPT-2: rank 1 builds on the meta device; the tie survives."""
    rank = dist.get_rank()
    if rank == 0:
        model = build("gpt2")
    else:
        with torch.device("meta"):
            model = build("gpt2")
    run = train("gpt2", fsdp_accelerator(auto_wrap_policy="SIZE_BASED_WRAP", cpu_ram_efficient_loading=True,
                                         sync_module_states=True), model=model)
    tied = run["model"].lm_head.weight is run["model"].transformer.wte.weight
    return {"loss_diff": max(gather_floats(max_difference(run["losses"], reference))),
            "ties_kept": min(gather_floats(float(tied)))}


def local_state_dict_refusal() -> dict[str, Any]:
    try:
        FullyShardedDataParallelPlugin(state_dict_type="LOCAL_STATE_DICT")
    except Exception as error:  # noqa: BLE001
        return {"refused": type(error).__name__, "message": str(error)}
    return {"refused": None}


def main() -> None:
    chosen = os.environ.get("MATRIX_MODELS")
    for name in (chosen.split(",") if chosen else MODELS):
        if not STRATEGIES:
            break
        print(f"[rank {os.environ.get('RANK')}] {name}/ddp", file=sys.stderr, flush=True)
        reference = train(name, Accelerator())["losses"]
        results[f"{name}/ddp"] = {"losses": reference[:3], "distributed_type": Accelerator().distributed_type.value}
        for policy in POLICIES:
            for strategy in STRATEGIES:
                recorded(f"{name}/{policy}/{strategy}", matrix_entry, name, policy, strategy, reference)
        if MODE == "two" and os.environ.get("MATRIX_SAVES", "1") == "1":
            # merge-weights writes whole-model weights; a LoRA model's are not a from_pretrained folder.
            if name != "lora":
                recorded(f"{name}/merge_weights", merged_weights_entry, name)
    if MODE == "two":
        rounded = build("llama_untied")  # DDP on the same weights: the head rounded to bfloat16, kept in float32
        rounded.lm_head.to(torch.bfloat16).to(torch.float32)
        recorded("mixed_dtypes", mixed_dtypes, train("llama_untied", Accelerator(), model=rounded)["losses"])
        recorded("meta_loading_tied", meta_loading_tied, train("gpt2", Accelerator())["losses"])
    if MODE in ("two", "one") and os.environ.get("MATRIX_SAVES", "1") == "1":
        for state_dict_type in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            recorded(f"save_load/{state_dict_type}", save_then_load, state_dict_type)
        results["save_load/LOCAL_STATE_DICT"] = local_state_dict_refusal()
    results["models"] = list(MODELS)
    write_results(OUT, f"matrix_{MODE}", results)


if __name__ == "__main__":
    main()
