"""Records which Trainer hooks are called, in which order and with what, under transformers' Trainer or trainkit's.

``python hook_order_worker.py {transformers|trainkit} OUT_DIR`` (or under torchrun) runs the same scenario on a
tiny BERT classifier, CPU only: ``train()`` with evaluation every 2 steps, checkpoints, the best model loaded at
the end; a second Trainer resuming from ``checkpoint-2``; ``evaluate()``; ``predict()``; ``save_model()``. A
subclass overrides every hook both Trainers have (the installed transformers' Trainer methods, read at run time)
and records each call: its name, its depth in the call stack, and each argument bound to transformers'
signature of that hook (defaults applied) and summarised (types, tensor shapes, dict keys, folder names).
Writes ``OUT_DIR/calls-rank{N}.json``. tests/trainer/test_hook_call_order.py compares the two.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

NOT_RECORDED = {
    # Utilities called wherever a value is needed, not steps of the run (their counts are implementation details).
    "is_world_process_zero", "is_local_process_zero", "get_tp_size", "get_cp_size", "get_sp_size",
    # Callback list management: the script's setup, not the run.
    "add_callback", "pop_callback", "remove_callback",
}
TRAINKIT_LOG_EXTRAS = {"samples_per_second", "step_time", "tokens_per_second", "mfu"}
"""Throughput figures trainkit adds to the training log (documented in docs/trainer.md), left out of the summary."""


def hooks(transformers_trainer: type, ours: type) -> dict[str, inspect.Signature]:
    """The methods of transformers' Trainer that both Trainers have, with transformers' signature each."""
    found = {}
    for name in dir(transformers_trainer):
        if name.startswith("__") or name in NOT_RECORDED or not hasattr(ours, name):
            continue
        static = inspect.getattr_static(transformers_trainer, name)
        if isinstance(static, (staticmethod, classmethod, property)) or not callable(static):
            continue
        found[name] = inspect.signature(getattr(transformers_trainer, name))
    return found


def summary(value: Any, depth: int = 0) -> Any:
    """What a hook receives, comparable across the two Trainers: kinds, shapes, keys and folder names."""
    from torch.utils.data import DataLoader, Dataset

    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)}"
    if isinstance(value, nn.Module):
        return "Module"
    if isinstance(value, (DataLoader, Dataset)) or type(value).__name__ in ("Dataset", "DataLoaderShard",
                                                                            "PreparedDataLoader"):
        return "DataLoader" if isinstance(value, DataLoader) or "DataLoader" in type(value).__name__ else "Dataset"
    if type(value).__name__ == "TrainingArguments":
        return "TrainingArguments"
    if isinstance(value, dict) or hasattr(value, "keys") and hasattr(value, "items"):
        keys = sorted(k for k in value.keys() if k not in TRAINKIT_LOG_EXTRAS)
        return {str(k): summary(value[k], depth + 1) for k in keys} if depth < 2 else sorted(map(str, keys))
    if isinstance(value, (list, tuple)):
        return [summary(v, depth + 1) for v in value]
    if isinstance(value, str):
        return checkpoint_name(value) if os.sep in value else value
    if isinstance(value, (bool, type(None))):
        return value
    if isinstance(value, (int, float)):
        return type(value).__name__
    if isinstance(value, torch.device):
        return "device"
    if callable(value):
        return "callable"
    if hasattr(value, "__next__"):
        return "iterator"
    return type(value).__name__


def checkpoint_name(path: str) -> str:
    """A folder's name; trainkit writes ``checkpoint-N`` in a hidden staging folder renamed when complete."""
    name = os.path.basename(os.path.normpath(path))
    if name.startswith(".") and ".staging" in name:
        name = name[1:name.index(".staging")]
    return name if name.startswith("checkpoint-") else "<folder>"


def recording_subclass(base: type, signatures: dict[str, inspect.Signature], calls: list) -> type:
    depth = [0]

    def wrap(name: str, signature: inspect.Signature):
        def method(self, *args, **kwargs):
            try:
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                received = {key: summary(value) for key, value in list(bound.arguments.items())[1:]}
            except TypeError as error:  # called with arguments transformers' signature does not take
                received = {"unbindable": str(error)}
            calls.append([name, depth[0], received])
            depth[0] += 1
            try:
                return getattr(super(recording, self), name)(*args, **kwargs)
            finally:
                depth[0] -= 1

        method.__name__ = name
        return method

    recording = type(f"Recording{base.__name__}", (base,), {n: wrap(n, s) for n, s in signatures.items()})
    return recording


def tiny_model() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


def table(rows: int, seed: int):
    """A ``datasets.Dataset`` with a column the model does not take (``idx``: removed by _remove_unused_columns)."""
    import datasets

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (rows, 6), generator=g)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 6] * rows,
                                       "labels": torch.randint(0, 2, (rows,), generator=g).tolist(),
                                       "idx": list(range(rows))}).with_format("torch")


class DictRows(torch.utils.data.Dataset):
    """A torch dataset of dicts with a key the model does not take (dropped by the collator's column filter)."""

    def __init__(self, rows: int) -> None:
        self.rows = table(rows, seed=3)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def run(framework: str, out_dir: Path) -> None:
    import transformers

    import trainkit

    module = transformers if framework == "transformers" else trainkit
    calls: list = []
    recording = recording_subclass(module.Trainer, hooks(transformers.Trainer, trainkit.Trainer), calls)
    output = out_dir / framework

    def trainer():
        args = module.TrainingArguments(
            output_dir=str(output), per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=4,
            gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
            logging_steps=2, load_best_model_at_end=True, metric_for_best_model="accuracy", report_to="none",
            disable_tqdm=True, use_cpu=True, seed=1)
        return recording(model=tiny_model(), args=args, train_dataset=table(16, 1), eval_dataset=table(6, 2),
                         compute_metrics=accuracy)

    made = {"first": trainer()}

    def resume():
        made["resumed"] = trainer()  # built after the first run, as a script resuming later would
        calls.clear()
        made["resumed"].train(resume_from_checkpoint=str(output / "checkpoint-2"))

    steps = (("train", made["first"].train), ("resume", resume), ("evaluate", lambda: made["resumed"].evaluate()),
             ("predict", lambda: made["resumed"].predict(DictRows(5))), ("save_model", lambda: made["resumed"].save_model()))
    phases: dict[str, list] = {}
    for phase, action in steps:
        calls.clear()
        try:
            action()
        except Exception as error:  # noqa: BLE001 - recorded: the test decides whether it is a known failure
            if framework != "transformers":
                raise
            # transformers' own Trainer failed here: the later phases are not run (the test compares the earlier)
            phases["failed"] = [[phase, 0, {"error": f"{type(error).__name__}: {error}"}]]
            break
        phases[phase] = list(calls)
    rank = int(os.environ.get("RANK", "0"))
    first = made["first"]
    phases["processes"] = [[str(first.args.parallel_mode), first.accelerator.num_processes, {}]]  # ran as launched
    (out_dir / f"{framework}-rank{rank}.json").write_text(json.dumps(phases, indent=1))


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]))
