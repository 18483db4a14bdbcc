"""Run tests/cluster/scripts/{accelerate_loop,trainer_script}.py inside a Ray Train ``TorchTrainer`` on CPU.

``python ray_driver.py {accelerate,trainer} OUT_DIR [--kill_at STEP]``: ``ray.init(num_cpus=2)``, two CPU workers,
``FailureConfig(max_failures=1)``, checkpoints kept under ``OUT_DIR/ray``. With ``--kill_at``, rank 1 kills its
own process at that step of the first attempt; Ray restarts both workers, which resume from
``ray.train.get_checkpoint()``. Writes ``OUT_DIR/ray_result.json``: the final metrics and, for every
checkpoint Ray kept, its metrics and file names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import ray
import ray.train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))


def accelerate_worker(config: dict) -> None:
    import accelerate_loop

    checkpoint = ray.train.get_checkpoint()

    def report(folder: str, step: int, loss: float) -> None:
        # The folder is on a disk every worker shares here, so rank 0 hands it to Ray (Ray's own pattern).
        shared = Checkpoint.from_directory(folder) if ray.train.get_context().get_world_rank() == 0 else None
        ray.train.report({"step": step, "loss": loss}, checkpoint=shared)

    if checkpoint is None:
        accelerate_loop.train(config["out"], on_checkpoint=report, kill_at=config["kill_at"])
    else:
        with checkpoint.as_directory() as folder:
            accelerate_loop.train(config["out"], resume_from=folder, on_checkpoint=report, kill_at=config["kill_at"])


def trainer_worker(config: dict) -> None:
    import trainer_script
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    checkpoint = ray.train.get_checkpoint()
    options = dict(callbacks=[RayTrainReportCallback()], prepare=prepare_trainer, kill_at=config["kill_at"])
    if checkpoint is None:
        trainer_script.train(config["out"], **options)
    else:
        with checkpoint.as_directory() as folder:
            trainer_script.train(config["out"], resume_from=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME),
                                 **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["accelerate", "trainer"])
    parser.add_argument("out")
    parser.add_argument("--kill_at", type=int, default=None)
    options = parser.parse_args()
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    trainer = TorchTrainer(
        accelerate_worker if options.workload == "accelerate" else trainer_worker,
        train_loop_config={"out": str(out), "kill_at": options.kill_at},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(out / "ray"), name="run", failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    kept = [{"metrics": metrics, "files": sorted(os.listdir(ckpt.path))} for ckpt, metrics in result.best_checkpoints]
    (out / "ray_result.json").write_text(json.dumps({"metrics": result.metrics, "checkpoints": kept}, default=str))
    ray.shutdown()


if __name__ == "__main__":
    main()
