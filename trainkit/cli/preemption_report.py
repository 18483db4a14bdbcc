"""What the launcher learns from workers that saved and stopped on a preemption signal.

torchrun's agent stops the workers itself when the launcher is signalled, and does not hand their exit codes
back; so each worker that saved a checkpoint and stopped leaves a small JSON note in a folder named by
``TRAINKIT_PREEMPTION_REPORT`` (written by the engine, see ``trainkit.engine.process.preemption``). The launcher reads
the notes to exit with :data:`PREEMPTED_EXIT_CODE` and say which checkpoint the rerun will resume from.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from trainkit.config.preemption import PREEMPTED_EXIT_CODE


class PreemptionReport:
    """A temporary folder of per-rank notes, removed when the launch ends."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="trainkit-preemption-")

    def __enter__(self) -> PreemptionReport:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def notes(self) -> list[dict[str, Any]]:
        """Every readable note, in rank order."""
        found = []
        for path in sorted(Path(self.folder).glob("rank-*.json")):
            try:
                found.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue  # a worker killed while writing it: not a completed save
        return sorted(found, key=lambda note: note.get("rank", 0))

    def saved_ranks(self) -> list[int]:
        """Global ranks (on this machine) that saved and stopped on a signal."""
        return [int(note.get("rank", -1)) for note in self.notes()]

    def all_preempted(self, error: Any) -> bool:
        """True when torchrun's failures are all workers that saved and stopped on a signal.

        A worker counts when it exited with :data:`PREEMPTED_EXIT_CODE`, or left a note and was then stopped by
        the agent while exiting (the agent stops the others as soon as the first one exits).
        """
        failures = dict(getattr(error, "failures", {}) or {})
        saved = set(self.saved_ranks())
        codes = {rank: getattr(failure, "exitcode", None) for rank, failure in failures.items()}
        return (PREEMPTED_EXIT_CODE in codes.values()
                and all(code == PREEMPTED_EXIT_CODE or rank in saved for rank, code in codes.items()))

    def describe(self, signal_name: str | None) -> str:
        """One line for the user: what was saved, the exit code and how to continue."""
        notes = self.notes()
        checkpoint = next((note.get("checkpoint") for note in notes if note.get("checkpoint")), None)
        cause = f"{signal_name} received" if signal_name else "a worker received a stop signal"
        saved = f"the workers saved {checkpoint} and stopped" if checkpoint else "the workers saved and stopped"
        return (f"trainkit launch: {cause}: {saved}; exiting with {PREEMPTED_EXIT_CODE} (preempted: requeue the job, "
                "or run the same command again, to resume).")
