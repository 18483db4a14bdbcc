"""trainkit's own tracker (``log_with="jsonl"``, ``report_to="jsonl"``): one JSON line per ``log`` call, on disk at once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import GeneralTracker, on_main_process, jsonable



class JSONLTracker(GeneralTracker):
    """One JSON object per ``log`` call appended to ``<logging_dir>/<run_name>/metrics.jsonl``.

    The file is opened for each record and closed at once: no handle outlives a call, so a Trainer that
    evaluates after ``train()`` ended (the trackers restart for that log) leaves nothing open, and every
    line is on disk as soon as ``log`` returns.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str) -> None:
        super().__init__()
        self.directory = os.path.join(logging_dir, run_name)
        self.path = os.path.join(self.directory, "metrics.jsonl")

    @on_main_process
    def start(self) -> None:
        """Create the run's folder."""
        os.makedirs(self.directory, exist_ok=True)

    @property
    def tracker(self) -> str:
        """The metrics file (the JSONL log has no client object)."""
        return self.path

    @on_main_process
    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        with open(os.path.join(self.directory, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(jsonable(dict(values)), handle, indent=2)

    @on_main_process
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, "time": round(time.time(), 3), **jsonable(dict(values))}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def finish(self) -> None:
        """Nothing to close: every record was written and closed by :meth:`log`."""
