"""Run tests/cluster/scripts/{accelerate_loop,trainer_script}.py inside Ray Train ``TorchTrainer`` runs on CPU.

``python ray_driver.py OUT_DIR RUN [RUN ...]``, a RUN being ``accelerate`` or ``trainer``, optionally followed by
``:kill=STEP``: one ``ray.init(num_cpus=2)``, then for each RUN a ``TorchTrainer`` with two CPU workers and
``FailureConfig(max_failures=1)`` writing into ``OUT_DIR/<RUN>``. With ``kill=STEP``, rank 1 kills its own process
(SIGKILL) at that step of the first attempt; Ray restarts both workers, which resume from
``ray.train.get_checkpoint()`` (each records the folder in ``resumed_from.txt``). Each run writes
``ray_result.json``: the final metrics and, for every checkpoint Ray kept, its path and metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ray
import ray.train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

# Ray adds the driver's folder to its workers' import path too, so they find the two scripts.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@contextlib.contextmanager
def ray_checkpoint_folder(inner: str = "") -> Iterator[str | None]:
    """The folder of the checkpoint Ray hands a restarted worker (None on the first attempt)."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as folder:
        yield os.path.join(folder, inner) if inner else folder


def _note_resume(out: str, folder: str | None) -> None:
    if folder is not None:
        with open(os.path.join(out, "resumed_from.txt"), "a") as f:
            f.write(f"{ray.train.get_context().get_world_rank()} {folder}\n")


def accelerate_worker(config: dict) -> None:
    import accelerate_loop

    def report(folder: str, step: int, loss: float) -> None:
        # The folder is on a disk every worker shares here, so rank 0 hands it to Ray (Ray's own pattern).
        shared = Checkpoint.from_directory(folder) if ray.train.get_context().get_world_rank() == 0 else None
        ray.train.report({"step": step, "loss": loss}, checkpoint=shared)

    with ray_checkpoint_folder() as resume_from:
        _note_resume(config["out"], resume_from)
        accelerate_loop.train(config["out"], resume_from=resume_from, on_checkpoint=report, kill_at=config["kill_at"])


def trainer_worker(config: dict) -> None:
    import trainer_script
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    with ray_checkpoint_folder(RayTrainReportCallback.CHECKPOINT_NAME) as resume_from:
        _note_resume(config["out"], resume_from)
        trainer_script.train(config["out"], callbacks=[RayTrainReportCallback()], prepare=prepare_trainer,
                             resume_from=resume_from, kill_at=config["kill_at"])


def run(out: Path, spec: str) -> None:
    workload, _, option = spec.partition(":")
    kill_at = int(option.removeprefix("kill=")) if option else None
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trainer = TorchTrainer(
        {"accelerate": accelerate_worker, "trainer": trainer_worker}[workload],
        train_loop_config={"out": str(out), "kill_at": kill_at},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(out / "ray"), name="run", failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    kept = [{"path": ckpt.path, "metrics": metrics} for ckpt, metrics in result.best_checkpoints]
    (out / "ray_result.json").write_text(json.dumps(
        {"metrics": result.metrics, "checkpoints": kept, "seconds": time.perf_counter() - started}, default=str))


def main() -> None:
    out, specs = Path(sys.argv[1]).resolve(), sys.argv[2:]
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        for spec in specs:
            run(out / spec.replace(":", "-").replace("=", ""), spec)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
