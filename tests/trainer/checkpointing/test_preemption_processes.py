"""Preemption in real processes (CPU, 2 gloo ranks under `trainkit launch`): signals at chosen moments, one
saved checkpoint each time, exit code 75, and the same command resuming to bitwise the uninterrupted weights.

One chain of launches in one output folder (each run resumes from the previous one's checkpoint):
  SIGTERM mid-step | SIGTERM mid-evaluation | SIGUSR1 during a regular save |
  SIGTERM to one worker only | a second SIGTERM during the save | the same command to the end, then an
  uninterrupted run from scratch in the same processes as the reference.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli.cli_helpers import cli_env
from tests.distributed import REPO
from trainkit.config.preemption import PREEMPTED_EXIT_CODE
from trainkit.engine.checkpoint import list_checkpoints, verify_checkpoint
from trainkit.trainer.checkpointing.preemption import MARKER_NAME

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "preemption_worker.py"
DEADLINE = 240.0
EXIT_WITHIN = 45.0
"""Seconds from the signal to the launcher's exit: one step plus the save plus teardown on a loaded CI machine
(the default grace period is 90 s; exceeding it would have meant a SIGKILL and no checkpoint)."""



class Launch:
    """`trainkit launch --num_processes 2 --cpu preemption_worker.py OUT EVENTS`, with its events readable."""

    def __init__(self, tmp_path: Path, output_dir: Path, name: str, **env: str) -> None:
        self.events_file = tmp_path / f"{name}.events"
        self.events_file.write_text("")
        self.log_file = tmp_path / f"{name}.log"
        command = [sys.executable, "-m", "trainkit.cli.main", "launch", "--num_processes", "2", "--cpu",
                   str(WORKER), str(output_dir), str(self.events_file)]
        with open(self.log_file, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                            env=cli_env(tmp_path, **env))
        self.started = time.monotonic()

    def events(self) -> list[list[str]]:
        return [line.split() for line in self.events_file.read_text().splitlines() if line.strip()]

    def wait_for(self, kind: str, predicate=lambda value: True) -> int:
        """Block until rank 0 reported ``kind N`` with ``predicate(N)``; return N."""
        while time.monotonic() - self.started < DEADLINE:
            for event in self.events():
                if event[0] == kind and predicate(int(event[1])):
                    return int(event[1])
            if self.process.poll() is not None:
                raise AssertionError(f"the launch ended ({self.process.returncode}) before '{kind}':\n{self.output()}")
            time.sleep(0.02)
        raise AssertionError(f"no '{kind}' event within {DEADLINE}s:\n{self.output()}")

    def worker_pid(self, rank: int) -> int:
        self.wait_for("pid", lambda value: value == rank)
        return next(int(e[2]) for e in self.events() if e[0] == "pid" and int(e[1]) == rank)

    def finish(self) -> tuple[int, float]:
        """(exit status, seconds since the last signal) once the launcher exits."""
        signalled = getattr(self, "signalled_at", self.started)
        try:
            code = self.process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the launch did not exit:\n{self.output()}") from None
        return code, time.monotonic() - signalled

    def signal(self, sig: signal.Signals, pid: int | None = None) -> None:
        os.kill(pid or self.process.pid, sig)
        self.signalled_at = time.monotonic()

    def output(self) -> str:
        return self.log_file.read_text()[-8000:]


def complete_checkpoints(output_dir: Path) -> dict[int, str]:
    return {entry.number: entry.path for entry in list_checkpoints(str(output_dir), "checkpoint-")
            if entry.complete and not entry.staging}


def assert_preempted(launch: Launch, output_dir: Path, signalled_step: int, resumed_from: int | None) -> int:
    """Exit 75 soon after the signal; a complete checkpoint at the step reached; resumed from the previous one."""
    code, seconds = launch.finish()
    output = launch.output()
    assert code == PREEMPTED_EXIT_CODE, f"exit {code}\n{output}"
    assert seconds < EXIT_WITHIN, f"{seconds:.1f}s from the signal to the exit\n{output}"
    steps = [int(e[1]) for e in launch.events() if e[0] == "step"]
    reached = max(steps)
    saved = complete_checkpoints(output_dir)
    assert reached in saved and reached >= signalled_step, (reached, sorted(saved), output)
    verify_checkpoint(saved[reached])  # every file present with its recorded checksum
    assert f"saved {saved[reached]}" in output and "exiting with 75" in output
    assert (output_dir / MARKER_NAME).is_file()
    if resumed_from is not None:
        assert f"resuming automatically from {output_dir / f'checkpoint-{resumed_from}'}" in output, output
        assert min(steps) == resumed_from + 1, (min(steps), resumed_from)  # continued, nothing redone
    return reached


def test_preemption_saves_once_exits_75_and_the_same_command_resumes_bitwise(tmp_path):
    """CPU, 2 gloo processes: every moment and every path of a preemption, then the finished run equals an
    uninterrupted one bit for bit."""
    reference_dir, output_dir = tmp_path / "reference", tmp_path / "run"
    # SIGTERM to the launcher in the middle of a step (each forward takes 30 ms).
    launch = Launch(tmp_path, output_dir, "mid-step")
    step = launch.wait_for("step", lambda s: s >= 4)
    launch.signal(signal.SIGTERM)
    saved = assert_preempted(launch, output_dir, step, resumed_from=None)

    # SIGTERM during an evaluation (every 20 steps; each evaluation batch takes 150 ms).
    launch = Launch(tmp_path, output_dir, "mid-eval")
    step = launch.wait_for("eval", lambda s: s > saved)
    launch.signal(signal.SIGTERM)
    saved = assert_preempted(launch, output_dir, step, resumed_from=saved)

    # Slurm's advance notice (SIGUSR1) during a regular save (every 15 steps; 1.5 s each here).
    launch = Launch(tmp_path, output_dir, "mid-save", SAVE_SECONDS="1.5")
    step = launch.wait_for("save", lambda s: s > saved)
    launch.signal(signal.SIGUSR1)
    saved = assert_preempted(launch, output_dir, step, resumed_from=saved)

    # SIGTERM to one worker only: the other rank learns it through the agreement and stops at the same step.
    launch = Launch(tmp_path, output_dir, "one-worker")
    step = launch.wait_for("step", lambda s: s >= saved + 2)
    launch.signal(signal.SIGTERM, pid=launch.worker_pid(1))
    saved = assert_preempted(launch, output_dir, step, resumed_from=saved)

    # A second SIGTERM while the checkpoint is being written (each save takes 4 s here): the processes stop
    # at once, the interrupted checkpoint never appears, the previous ones stay complete.
    launch = Launch(tmp_path, output_dir, "second-signal", SAVE_SECONDS="4")
    step = launch.wait_for("step", lambda s: s >= saved + 2)
    before = complete_checkpoints(output_dir)
    launch.signal(signal.SIGTERM)
    first_signal = launch.signalled_at
    saving = launch.wait_for("save", lambda s: s >= step)
    time.sleep(max(0.0, first_signal + 1.5 - time.monotonic()))  # past the window that ignores duplicates
    launch.signal(signal.SIGTERM)
    code, _ = launch.finish()
    assert code not in (0, PREEMPTED_EXIT_CODE), launch.output()
    after = complete_checkpoints(output_dir)
    assert saving not in after and max(after) < saving and set(before) <= set(after), (saving, before, after)
    for folder in after.values():
        verify_checkpoint(folder)
    assert (output_dir / f".checkpoint-{saving}.staging").exists()  # the interrupted write, never published

    # The same command again, to the end: bitwise the weights of an uninterrupted run (trained afterwards in
    # the same processes, from scratch).
    launch = Launch(tmp_path, output_dir, "final", REFERENCE_DIR=str(reference_dir), NO_SLEEP="1")
    code, _ = launch.finish()
    assert code == 0, launch.output()
    assert f"resuming automatically from {output_dir / f'checkpoint-{max(after)}'}" in launch.output()
    expected = load_file(str(reference_dir / "final" / "model.safetensors"))
    final = load_file(str(output_dir / "final" / "model.safetensors"))
    assert expected.keys() == final.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, final[name]), name
    assert not (output_dir / MARKER_NAME).exists()  # finished: the next run starts afresh
