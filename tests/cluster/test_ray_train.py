"""trainkit inside Ray Train's ``TorchTrainer``, against ``trainkit launch`` running the same scripts (#27).

CPU/gloo: ``ray.init(num_cpus=2)``, two CPU workers per ``TorchTrainer``. The scripts
(tests/cluster/scripts/accelerate_loop.py, trainer_script.py) are written once; tests/cluster/scripts/ray_driver.py
calls them from Ray training functions (``RayTrainReportCallback`` + ``prepare_trainer`` for the Trainer, resuming
from ``ray.train.get_checkpoint()``), ``trainkit launch --num_processes 2`` runs them as they are. Ray, its
process group and its restarts are real; only the killed worker is staged (rank 1 SIGKILLs itself at step 12).

Skipped, saying so, where Ray Train is not installed (``pip install 'trainkit[ray]'``). Time on a 2-core machine:
see the module fixture's comment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import ray.train.torch  # noqa: F401
except ImportError:
    pytest.skip("Ray Train is not installed (pip install 'trainkit[ray]'); the Ray Train tests need it.",
                allow_module_level=True)

from tests.distributed import REPO, free_port, worker_env  # noqa: E402
from trainkit.engine.checkpoint.atomic import verify_checkpoint  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPTS = Path(__file__).parent / "scripts"
KILL_AT = 12  # after the checkpoints of steps 5 and 10, before the one of step 15
TOLERANCE = 1e-6


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=worker_env(), cwd=REPO)


def _finish(process: subprocess.Popen, timeout: float) -> None:
    output, _ = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise AssertionError(f"{' '.join(process.args)} exited {process.returncode}\n{output[-8000:]}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One Ray session (an Accelerate loop; a Trainer script whose rank 1 dies at step 12) and, meanwhile, the
    same two scripts under ``trainkit launch --num_processes 2``. About 2-3 minutes on a busy 2-core machine,
    most of it Ray starting its processes and restarting the worker group."""
    out = tmp_path_factory.mktemp("ray")
    ray_run = _start([sys.executable, str(SCRIPTS / "ray_driver.py"), str(out / "ray"), "accelerate",
                      f"trainer:kill={KILL_AT}"])
    launches = [_start([sys.executable, "-m", "trainkit.cli.main", "launch", "--num_processes", "2",
                      "--main_process_port", str(free_port()), str(SCRIPTS / f"{name}.py"), str(out / "launch" / name)])
                for name in ("accelerate_loop", "trainer_script")]
    for launch in launches:
        _finish(launch, timeout=300)
    _finish(ray_run, timeout=600)
    return out


def _losses(path: Path) -> dict[int, list[float]]:
    """Step -> every loss logged for it (a step run again after a restart appears twice)."""
    steps: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], []).append(record["loss"])
    return steps


def _max_param_difference(a: Path, b: Path) -> float:
    first, second = json.loads(a.read_text()), json.loads(b.read_text())
    assert first["step"] == second["step"]
    return max(abs(x - y) for p, q in zip(first["params"], second["params"]) for x, y in zip(p, q, strict=True))


def _resumed_step(losses: dict[int, list[float]]) -> int:
    """The step a restarted run resumed from: every step after it and before the kill ran twice."""
    twice = sorted(step for step, values in losses.items() if len(values) == 2)
    assert twice and twice == list(range(twice[0], twice[-1] + 1)), losses
    return twice[0] - 1


def test_accelerate_loop_in_torchtrainer_matches_trainkit_launch(runs: Path) -> None:
    ray_dir, launch_dir = runs / "ray" / "accelerate", runs / "launch" / "accelerate_loop"
    for rank in (0, 1):
        under_ray, launched = _losses(ray_dir / f"losses-rank{rank}.jsonl"), _losses(launch_dir / f"losses-rank{rank}.jsonl")
        assert sorted(under_ray) == sorted(launched) == list(range(1, 17))
        assert max(abs(under_ray[s][0] - launched[s][0]) for s in launched) <= TOLERANCE
    assert _max_param_difference(ray_dir / "final.json", launch_dir / "final.json") <= TOLERANCE
    # rank 0 handed each save_state folder to ray.train.report: Ray kept all three, complete
    kept = json.loads((ray_dir / "ray_result.json").read_text())["checkpoints"]
    assert [c["metrics"]["step"] for c in kept] == [5, 10, 15]
    for checkpoint in kept:
        verify_checkpoint(checkpoint["path"])


def test_trainer_in_torchtrainer_with_a_killed_worker_resumes_from_ray_and_matches_trainkit_launch(runs: Path) -> None:
    ray_dir, launch_dir = runs / "ray" / f"trainer-kill{KILL_AT}", runs / "launch" / "trainer_script"
    under_ray, launched = _losses(ray_dir / "losses.jsonl"), _losses(launch_dir / "losses.jsonl")
    assert sorted(under_ray) == sorted(launched) == list(range(1, 17))
    # Every loss, of the first attempt and of the resumed one, equals the launched run's at that step.
    assert max(abs(value - launched[step][0]) for step, values in under_ray.items() for value in values) <= TOLERANCE
    assert _max_param_difference(ray_dir / "final.json", launch_dir / "final.json") <= TOLERANCE

    # The restarted workers resumed from a checkpoint Ray handed back (not from scratch, not from output_dir).
    # Which one is Ray's choice: the last its controller registered (it polls every 2 s) before the failure.
    resumed = _resumed_step(under_ray)
    assert resumed in (5, 10)
    folders = {line.split(" ", 1)[1] for line in (ray_dir / "resumed_from.txt").read_text().splitlines()}
    assert len(folders) == 1 and Path(next(iter(folders))).is_relative_to(ray_dir / "ray" / "run")

    # RayTrainReportCallback copied complete checkpoint folders (manifest verified) with the logged metrics.
    kept = json.loads((ray_dir / "ray_result.json").read_text())["checkpoints"]
    assert [c["metrics"]["step"] for c in kept] == [5, 10, 15, 16]
    for checkpoint in kept:
        trainer_checkpoint = Path(checkpoint["path"]) / "checkpoint"
        verify_checkpoint(str(trainer_checkpoint))
        state = json.loads((trainer_checkpoint / "trainer_state.json").read_text())
        assert state["global_step"] == checkpoint["metrics"]["step"]
        assert abs(checkpoint["metrics"]["loss"] - launched[state["global_step"]][0]) <= TOLERANCE  # log_history
