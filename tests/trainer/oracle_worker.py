"""Two processes (torchrun, gloo on CPU): trainkit's Trainer against transformers' own 2-process run, and trainkit's
exact resume; rank 0 writes ``OUT/results.json`` (assertions in tests/trainer/test_same_numbers_processes.py).

transformers' Trainer runs distributed on CPU only with ``use_cpu=True`` (otherwise Accelerate's state stays
single-process on a machine without GPUs and each process trains alone). Runs:
- ``gpt2``: a causal LM (its loss divides by num_items_in_batch, summed over both processes);
- ``bert_local``: the BERT classifier with ``average_tokens_across_devices=False`` (its loss is its own mean, which
  transformers leaves alone only then: with the default it multiplies it by the number of processes);
- ``bert_default``: the same with the default, to record transformers' doubled loss next to trainkit's;
- ``resume``: trainkit's MLM run stopped after step 2 and resumed, against the uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch.distributed as dist

import trainkit
import transformers
from tests.trainer.oracle_workload import train, weights_digest


def summary(run: dict) -> dict:
    return {**{key: run[key] for key in ("losses", "grad_norms", "eval_losses", "train_loss")},
            "weights": weights_digest(run["weights"])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    results: dict = {}
    for name, task, extra in (("gpt2", "gpt2", {}), ("bert_local", "bert", {"average_tokens_across_devices": False}),
                              ("bert_default", "bert", {})):
        results[name] = {library.__name__: summary(train(library, task, str(out / name / library.__name__), **extra))
                         for library in (transformers, trainkit)}
    run = str(out / "resume")
    full = train(trainkit, "mlm", str(out / "full"))
    first = train(trainkit, "mlm", run, save_strategy="steps", save_steps=2, stop_after=2)
    resumed = train(trainkit, "mlm", run, save_strategy="steps", save_steps=2, resume=f"{run}/checkpoint-2")
    results["resume"] = {"full": summary(full), "first": summary(first), "resumed": summary(resumed)}
    results["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    if not dist.is_initialized() or dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
