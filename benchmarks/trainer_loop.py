"""trainkit.Trainer against a hand-written loop and against transformers.Trainer, in one invocation.

Each repetition starts three fresh processes (or torchrun jobs), interleaved in rotating order:
the hand-written loop, trainkit's Trainer and — when ``benchmarks/setup_hf_baseline.sh`` has put
accelerate into ``benchmarks/.hf-extra`` — transformers' Trainer. Each reports its steady-state
step time and its time from process start to the end of its first step. Prints one JSON line per
loop with medians and the ratio to the hand-written loop (> 1 = faster).

trainkit fixes glibc's allocator thresholds in every process it runs (see trainkit/engine/process/allocator.py),
which alone makes a loop faster on CPU. ``hand_written_tuned`` is the hand-written loop with the same
allocator settings (as environment variables), so ``ratio_vs_hand_written_tuned`` is the framework's
own overhead, and ``ratio_vs_hand_written`` what a user gains by switching.

    python benchmarks/trainer_loop.py --workload bert-tiny --procs 1 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from launching import torchrun_command  # noqa: E402

HF_EXTRA = HERE / ".hf-extra"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["bert-tiny", "mnist-cnn"], default="bert-tiny")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--loops", default="hand_written,hand_written_tuned,trainkit,transformers")
    return parser.parse_args()


def run_once(loop: str, args: argparse.Namespace) -> dict:
    threads = str(max(2 // args.procs, 1))
    env = dict(os.environ, OMP_NUM_THREADS=threads,
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(HERE.parent))
    if loop == "transformers":
        env["PYTHONPATH"] += os.pathsep + str(HF_EXTRA)
    if loop == "hand_written_tuned":
        from trainkit.engine.process.allocator import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

        env.update(MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD_BYTES), MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD_BYTES))
    child = [str(HERE / "trainer_child.py"), "--loop", loop, "--workload", args.workload,
             "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--bf16"] if args.bf16 else [])
    if args.procs > 1:
        command = torchrun_command(args.procs, *child)
    else:
        command = [sys.executable, *child]
    env["BENCH_LAUNCH_TIME"] = repr(time.time())
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{loop} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    args = parse_args()
    loops = [loop for loop in args.loops.split(",") if loop != "transformers" or HF_EXTRA.exists()]
    results: dict[str, list[dict]] = {loop: [] for loop in loops}
    for rep in range(args.reps):
        order = loops[rep % len(loops):] + loops[: rep % len(loops)]
        for loop in order:
            results[loop].append(run_once(loop, args))
    medians = {loop: (statistics.median(r["step_s"] for r in runs), statistics.median(r["startup_s"] for r in runs),
                      statistics.median(r["startup_cpu_s"] for r in runs))
               for loop, runs in results.items()}
    hand_step, hand_start, hand_cpu = medians["hand_written"]
    for loop, runs in results.items():
        step, startup, startup_cpu = medians[loop]
        line = {
            "benchmark": "trainer_loop", "loop": loop, "workload": args.workload, "procs": args.procs,
            "bf16": args.bf16, "samples_per_s": round(runs[0]["global_batch"] / step, 1),
            "ratio_vs_hand_written": round(hand_step / step, 4), "startup_s": round(startup, 3),
            "startup_delta_vs_hand_written_s": round(startup - hand_start, 3),
            "startup_cpu_s": round(startup_cpu, 3), "startup_cpu_delta_vs_hand_written_s": round(startup_cpu - hand_cpu, 3),
            "reps": args.reps,
            "steps": args.steps,
        }
        if "hand_written_tuned" in medians:
            line["ratio_vs_hand_written_tuned"] = round(medians["hand_written_tuned"][0] / step, 4)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
