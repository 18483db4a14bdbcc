"""Weights & Biases (needs ``wandb``; imported when the tracker starts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import GeneralTracker, jsonable



class WandBTracker(GeneralTracker):
    """Logs to Weights & Biases (``wandb.init`` receives ``init_kwargs['wandb']``)."""

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        import wandb

        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        """The W&B run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.run.config.update(jsonable(dict(values)), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(dict(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()
