"""Weights & Biases (needs ``wandb``; imported when the tracker starts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import LibraryTracker, on_main_process, jsonable



class WandBTracker(LibraryTracker):
    """Logs to Weights & Biases (``wandb.init`` receives ``init_kwargs['wandb']``)."""

    name = "wandb"
    library_attribute = "run"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        """Keywords go to ``wandb.init`` when :meth:`start` runs (``init_trackers`` calls it), as in Accelerate."""
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Start the W&B run (``wandb.init(project=run_name, **init_kwargs)``)."""
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The W&B run."""
        return self.run

    @on_main_process
    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.run.config.update(jsonable(dict(values)), allow_val_change=True)

    @on_main_process
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(dict(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a list of images (arrays or PIL images), logged as ``wandb.Image`` objects."""
        import wandb

        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data`` rows, or from a ``dataframe``."""
        import wandb

        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)  # type: ignore[arg-type]  # wandb's stubs want lists; None is its default
        self.log({table_name: table}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
