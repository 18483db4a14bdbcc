"""Cost of surviving preemption: the Accelerator loop with and without ``check_preemption()``, interleaved.

One prepared model, optimizer and loader; the same step runs in three variants in turn (rotating which goes
first) so machine noise hits all alike:
  ``plain``       the step alone;
  ``check``       the step, then ``accelerator.check_preemption()`` (the default: an agreement round about
                  every 0.5 s, a 2-element gloo all-reduce that overlaps the next step);
  ``every_step``  the worst case: a round launched and read at every step (``check_interval=0``).
Prints one JSON line: ``ratio_check`` = plain step time / checked step time (1.00 = free), ``overhead_pct``
(the median over rounds of the paired ratio), and ``in_call_us`` / ``in_call_pct``: the time spent inside the
check itself per step, timed directly, which machine noise barely touches.

    python benchmarks/preemption_check.py --workload bert-tiny --procs 2
    python benchmarks/preemption_check.py --workload mnist-cnn --procs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launching import torchrun_command  # noqa: E402
from workloads import WORKLOADS, build  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bert-tiny")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=30, help="rounds (each runs every variant, in rotating order)")
    return parser.parse_args()


class CheckedLoop:
    """Accelerate-style loop; ``step(variant)`` adds the preemption check the variant names."""

    def __init__(self, workload: str, project_dir: str) -> None:
        import torch
        from torch.utils.data import DataLoader

        from trainkit import Accelerator
        from trainkit.engine.process.preemption import PreemptionWatch
        from trainkit.utils import ProjectConfiguration

        self.accelerator = Accelerator(project_config=ProjectConfiguration(
            project_dir=project_dir, automatic_checkpoint_naming=True))
        model, dataset, self.batch_size, self.forward = build(workload)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=True)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)
        self.every_step = PreemptionWatch(check_interval=0.0).start()
        self.batches = self._cycle()
        self.in_call = {"check": [0.0, 0], "every_step": [0.0, 0]}

    def _cycle(self):
        while True:
            yield from self.loader

    def step(self, variant: str) -> None:
        loss = self.forward(self.model, next(self.batches))
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if variant == "plain":
            return
        start = time.perf_counter()
        if variant == "check":
            self.accelerator.check_preemption()
        elif self.every_step.poll():
            raise SystemExit("a preemption signal arrived during the benchmark")
        spent = self.in_call[variant]
        spent[0] += time.perf_counter() - start
        spent[1] += 1


def time_steps(loop: CheckedLoop, variant: str, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        loop.step(variant)
    return (time.perf_counter() - start) / steps


def main() -> None:
    args = parse_args()
    if args.procs > 1 and "LOCAL_RANK" not in os.environ:
        command = torchrun_command(args.procs, *sys.argv)
        sys.exit(subprocess.call(command, env=dict(os.environ, OMP_NUM_THREADS=str(max(2 // args.procs, 1)))))
    import torch

    torch.set_num_threads(max(2 // args.procs, 1))
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as project_dir:
        loop = CheckedLoop(args.workload, project_dir)
        variants = ["plain", "check", "every_step"]
        for variant in variants:
            time_steps(loop, variant, args.warmup)
        times: dict[str, list[float]] = {variant: [] for variant in variants}
        for rep in range(args.reps):
            order = variants[rep % 3:] + variants[:rep % 3]
            for variant in order:
                times[variant].append(time_steps(loop, variant, args.steps))
        loop.accelerator.end_training()
        if loop.accelerator.is_main_process:
            plain = statistics.median(times["plain"])
            ratio = {v: statistics.median(p / t for p, t in zip(times["plain"], times[v])) for v in variants[1:]}
            in_call = {v: total / max(count, 1) for v, (total, count) in loop.in_call.items()}
            print(json.dumps({
                "benchmark": "preemption_check", "workload": args.workload, "procs": loop.accelerator.num_processes,
                "step_ms": round(1000 * plain, 3),
                "ratio_check": round(ratio["check"], 4), "overhead_pct": round(100 * (1 / ratio["check"] - 1), 3),
                "in_call_us": round(1e6 * in_call["check"], 1), "in_call_pct": round(100 * in_call["check"] / plain, 4),
                "ratio_every_step": round(ratio["every_step"], 4),
                "overhead_every_step_pct": round(100 * (1 / ratio["every_step"] - 1), 3),
                "in_call_every_step_us": round(1e6 * in_call["every_step"], 1),
                "in_call_every_step_pct": round(100 * in_call["every_step"] / plain, 4),
                "rounds": args.reps, "steps_per_round": args.steps,
            }), flush=True)


if __name__ == "__main__":
    main()
