"""GPU benchmark users run on their own card: hand-written loop vs trainkit (engine and Trainer) vs transformers.

For each model (GPT-2 small at 8 x 1024 tokens, BERT-base at 64 x 128, both built from configs), bf16,
eager and compiled, with and without FSDP2 (one process), it runs every loop in a fresh process,
``--reps`` times in rotating order, and prints one JSON line per (model, variant, loop): samples/s,
the ratio to the hand-written loop of the same repetition (> 1 = faster), MFU against the detected
card's dense bf16 peak (6 x parameters x tokens per step; attention FLOPs not counted, so MFU is a
slight underestimate for GPT-2), peak memory and host syncs per steady-state step. ``--markdown``
also prints the table docs/gpu.md shows.

    python benchmarks/gpu_training.py                       # everything (~15 min on one H100)
    python benchmarks/gpu_training.py --models gpt2-small --variants eager --reps 3
    python benchmarks/gpu_training.py --models gpt2-tiny --variants eager --loops hand,accelerator  # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Dense bf16 peak TFLOP/s by the name torch reports (substring match, most specific first).
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
               ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0), ("L4", 121.0),
               ("RTX 4090", 165.0), ("A6000", 155.0)]
VARIANTS = {"eager": [], "compiled": ["--compile"], "fsdp": ["--fsdp"], "fsdp-compiled": ["--fsdp", "--compile"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2-small,bert-base")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--loops", default="hand,accelerator,trainer,hf_trainer")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--markdown", action="store_true")
    return parser.parse_args()


def peak_tflops() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    return name, next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def hf_trainer_available() -> bool:
    try:
        import accelerate  # noqa: F401  (transformers.Trainer needs it; trainkit never does)
    except ImportError:
        return False
    return True


def run_child(loop: str, model: str, variant: str, args: argparse.Namespace) -> dict | None:
    command = [sys.executable, str(HERE / "gpu_child.py"), "--loop", loop, "--model", model,
               "--steps", str(args.steps), "--warmup", str(args.warmup), *VARIANTS[variant]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        print(f"# {loop} {model} {variant} failed: {result.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT "):])


def summarise(runs: dict[str, list[dict]], card: str, peak: float | None) -> list[dict]:
    """Medians per loop, and each loop's ratio to the hand-written loop of the same repetition."""
    rows = []
    hand = runs.get("hand", [])
    for loop, results in runs.items():
        if not results:
            continue
        first = results[0]
        step_s = statistics.median(r["step_s"] for r in results)
        ratios = [h["step_s"] / r["step_s"] for h, r in zip(hand, results)]
        flops = 6 * first["params"] * first["tokens_per_step"] / step_s
        rows.append({"card": card, "model": first["model"], "compile": first["compile"], "fsdp": first["fsdp"],
                     "loop": loop, "samples_per_s": round(statistics.median(r["samples_per_s"] for r in results), 2),
                     "ratio_vs_hand": round(statistics.median(ratios), 3) if ratios else None,
                     "mfu": round(flops / (peak * 1e12), 3) if peak else None,
                     "peak_mem_gib": first.get("peak_mem_gib") and round(first["peak_mem_gib"], 2),
                     "syncs_per_step": first.get("syncs_per_step")})
    return rows


def main() -> None:
    args = parse_args()
    card, peak = peak_tflops()
    loops = [loop for loop in args.loops.split(",") if loop != "hf_trainer" or hf_trainer_available()]
    table = []
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            runs: dict[str, list[dict]] = {loop: [] for loop in loops}
            for rep in range(args.reps):
                for loop in loops[rep % len(loops):] + loops[:rep % len(loops)]:  # rotate the order
                    result = run_child(loop, model, variant, args)
                    if result is not None:
                        runs[loop].append(result)
            for row in summarise(runs, card, peak):
                print(json.dumps(row), flush=True)
                table.append(row)
    if args.markdown:
        print("| model | variant | loop | samples/s | vs hand-written | MFU | peak GiB | syncs/step |")
        print("|---|---|---|---|---|---|---|---|")
        for row in table:
            variant = ("FSDP " if row["fsdp"] else "") + ("compiled" if row["compile"] else "eager")
            print(f"| {row['model']} | {variant} | {row['loop']} | {row['samples_per_s']} | {row['ratio_vs_hand']} | "
                  f"{row['mfu']} | {row['peak_mem_gib']} | {row['syncs_per_step']} |")


if __name__ == "__main__":
    main()
