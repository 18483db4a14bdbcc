"""Accelerate's tracking methods (``init_trackers``, ``get_tracker``, ``log``, ``end_training``) for the facade.

``Accelerator`` inherits :class:`TrackerAPI`; the trackers themselves live in :mod:`trainkit.engine.tracking`.
"""

from __future__ import annotations

from typing import Any

from trainkit.engine.tracking import GeneralTracker, find_tracker, start_trackers


class TrackerAPI:
    """The run's trackers (main process only): those named in ``log_with`` (``"jsonl"`` for trainkit's JSONL log)."""

    trackers: list[GeneralTracker]
    log_with: list[Any]
    is_main_process: bool

    @property
    def logging_dir(self) -> str | None:
        """Where trackers write (the facade says)."""
        raise NotImplementedError

    @property
    def project_dir(self) -> str | None:
        """The run's folder (the facade says)."""
        raise NotImplementedError

    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Build the trackers named in ``log_with`` on every process and start them: the built-in
        ones create their runs on the main process only (so ``get_tracker`` answers everywhere, as in Accelerate)."""
        logging_dir = self.logging_dir or self.project_dir or "runs"
        self.trackers = start_trackers(project_name, logging_dir, self.log_with, init_kwargs, config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called ``name``: trainkit's tracker object, or with ``unwrap`` the library's own
        (TensorBoard's ``SummaryWriter``, the W&B run, MLflow's active run; on other processes than the main one
        it does not exist). Before ``init_trackers``, an empty ``GeneralTracker``, as in Accelerate."""
        if not self.trackers:
            return GeneralTracker(_blank=True)
        tracker: Any = find_tracker(self.trackers, name)
        return tracker.tracker if unwrap else tracker

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, dict] | None = None) -> None:
        """Send values to every tracker (main process only; nested dicts as each tracker groups them)."""
        if not self.is_main_process:
            return
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish the checkpoint being written in the background (raising its error), flush and close the
        trackers; stop handling preemption signals."""
        from trainkit.engine.process.preemption import stop_watching

        finish_checkpoints = getattr(self, "_checkpoints_at_end", None)  # the Accelerator's CheckpointAPI
        if finish_checkpoints is not None:
            finish_checkpoints()
        stop_watching(self)
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
