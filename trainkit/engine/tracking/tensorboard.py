"""TensorBoard event files (needs ``tensorboard``; imported when the tracker starts)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import LibraryTracker, on_main_process, jsonable, warn_skipped



class TensorBoardTracker(LibraryTracker):
    """Scalars to TensorBoard event files in ``<logging_dir>/<run_name>``.

    Numbers become scalars, strings text, and a dict of numbers one ``add_scalars`` group (each entry in
    its own ``<run>/<key>_<entry>`` sub-run, plotted together), as Accelerate writes them.
    """

    name = "tensorboard"
    library_attribute = "writer"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
        """Keywords go to ``SummaryWriter``; its ``log_dir`` (trainkit; Accelerate's tracker refuses it) writes
        the event files in that folder instead of ``<logging_dir>/<run_name>`` (the Trainer's ``logging_dir``).
        Nothing is created before :meth:`start` (``init_trackers`` calls it), as in Accelerate."""
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.logging_dir = kwargs.pop("log_dir", None) or os.path.join(logging_dir, run_name)
        """The folder of this run's event files (Accelerate's attribute)."""
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open the ``SummaryWriter``."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.writer.add_text("config", json.dumps(jsonable(dict(values)), indent=2))

    @on_main_process
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=step)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, _numbers_only(key, value), global_step=step)
            else:
                warn_skipped(self.name, key, value)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a batch of images (``SummaryWriter.add_images``; ``kwargs`` such as ``dataformats`` go there)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        self.writer.close()


def _numbers_only(key: str, values: Mapping[str, Any]) -> dict[str, float]:
    numbers = {}
    for name, value in values.items():
        value = jsonable(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[str(name)] = value
        else:
            warn_skipped("tensorboard", f"{key}/{name}", value)
    return numbers
