"""Where trainkit.Trainer's start-up goes, against a hand-written loop, in CPU seconds (usable on a loaded machine).

``trainer_loop.py`` measures the time to the end of the first step. This script says what that time is made of:
fresh processes import, in order, what a Trainer run imports that a hand-written loop of the same workload does
not (``torch`` and ``torch._dynamo``, which the hand-written loop's AdamW construction imports too, come first,
then the workload's own model code), and print each stage's CPU seconds (median of ``--reps`` processes) and the
number of modules it adds. Then it runs both loops to the end of their first step (``trainer_child.py``) and
prints the CPU seconds each used until then. CPU time counts work, not waiting, so a busy machine inflates it
little; wall-clock start-up on a quiet machine is ``trainer_loop.py``'s ``startup_s``.

    python benchmarks/first_step.py --workload mnist-cnn
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Each stage: (label, modules imported in it). trainkit's own modules come first; the transformers stages are what
# a run pays when it needs transformers (a transformers model, an optimizer or schedule transformers resolves, a
# collator for other features): a plain nn.Module run with torch's optimizers does not (each run's line says
# whether it imported transformers). transformers.trainer_utils imports peft at module level whenever peft is
# installed, and peft imports transformers' model code (and accelerate, when installed).
STAGES = [
    ("trainkit's Trainer, arguments and engine", ["trainkit.trainer.trainer", "trainkit.engine.accelerator"]),
    ("transformers (package)", ["transformers"]),
    ("transformers.trainer_utils (+ peft, accelerate if installed)", ["transformers.trainer_utils"]),
    ("optimizer names/handlers, get_scheduler", ["transformers.training_args", "transformers.trainer_optimizer",
                                                 "transformers.optimization", "transformers.trainer_pt_utils"]),
    ("default_data_collator", ["transformers.data.data_collator"]),
]

STAGE_CODE = r"""
import importlib, json, sys, time
import torch, torch._dynamo, torch.optim
sys.path.insert(0, {repo!r})
from benchmarks.workloads import build
build({workload!r})
out = []
for label, modules in {stages!r}:
    cpu, count = time.process_time(), len(sys.modules)
    for module in modules:
        importlib.import_module(module)
    out.append((time.process_time() - cpu, len(sys.modules) - count))
print(json.dumps(out))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["bert-tiny", "mnist-cnn"], default="mnist-cnn")
    parser.add_argument("--reps", type=int, default=5)
    return parser.parse_args()


def child_env() -> dict[str, str]:
    # one thread: an idle OpenMP thread spinning on a busy machine would count as CPU time
    return dict(os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false")


def run_json(command: list[str]) -> Any:
    result = subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=HERE.parent, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("[", "{"))]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{command} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    args = parse_args()
    code = STAGE_CODE.format(repo=str(HERE.parent), workload=args.workload, stages=STAGES)
    stage_runs = [run_json([sys.executable, "-c", code]) for _ in range(args.reps)]
    for index, (label, _) in enumerate(STAGES):
        cpu = statistics.median(run[index][0] for run in stage_runs)
        print(json.dumps({"benchmark": "first_step", "workload": args.workload, "stage": label,
                          "cpu_s": round(cpu, 3), "modules": stage_runs[0][index][1]}), flush=True)
    to_first_step: dict[str, list[float]] = {"hand_written": [], "trainkit": []}
    imports_transformers: dict[str, bool] = {}
    for rep in range(args.reps):
        for loop in (["hand_written", "trainkit"] if rep % 2 == 0 else ["trainkit", "hand_written"]):
            line = run_json([sys.executable, str(HERE / "trainer_child.py"), "--loop", loop, "--workload",
                             args.workload, "--steps", "2", "--warmup", "0"])
            to_first_step[loop].append(line["startup_cpu_s"])
            imports_transformers[loop] = line["imports_transformers"]
    hand = statistics.median(to_first_step["hand_written"])
    for loop, values in to_first_step.items():
        print(json.dumps({"benchmark": "first_step", "workload": args.workload, "loop": loop,
                          "cpu_to_first_step_s": round(statistics.median(values), 3),
                          "delta_vs_hand_written_s": round(statistics.median(values) - hand, 3),
                          "imports_transformers": imports_transformers[loop]}), flush=True)


if __name__ == "__main__":
    main()
