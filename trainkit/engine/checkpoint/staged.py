"""The checkpoint being written, as the code that fills it sees it: :class:`StagedCheckpoint`.

``Checkpointer.save(folder, write)`` calls ``write(staged)`` on every process once the checkpoint's place is
staged. Everything written goes through ``staged``: the engine's state (:meth:`~StagedCheckpoint.write_engine_state`,
:meth:`~StagedCheckpoint.write_model`), small files (:meth:`~StagedCheckpoint.write_text`), and files that a third
party writes into a folder of its own (``save_pretrained``, ``save_state`` pre-hooks: :meth:`~StagedCheckpoint.local_folder`),
so the same callback works for a synchronous save, an asynchronous one (captured now, written by the background
writer) and on every storage backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import state_io
from .model_state import Writing

if TYPE_CHECKING:
    from .protocol import CheckpointedAccelerator
    from .sinks import FileSink
    from .storage.base import CheckpointStorage


@dataclasses.dataclass
class StagedCheckpoint:
    """One checkpoint being written (see the module doc)."""

    path: str
    """Where its files go until it is committed (a hidden staging folder, or the object-store prefix)."""
    sink: FileSink
    writes_shared: bool
    """True on the process that writes the files one process writes (rank 0; each node's first with each node's own
    folder). Every process calls the writing methods; they write on the right processes."""
    accelerator: CheckpointedAccelerator
    full_everywhere: bool = False

    @property
    def storage(self) -> CheckpointStorage:
        """The backend the checkpoint is written to."""
        return self.sink.storage

    def file(self, name: str) -> str:
        """The location of the file ``name`` inside the checkpoint."""
        return self.storage.join(self.path, name)

    def writing(self) -> Writing:
        """What the model-state writers need to know about this write."""
        return Writing(self.sink, self.path, self.writes_shared, self.full_everywhere)

    def write_text(self, name: str, text: str) -> None:
        """A small text file (written by the process that writes the shared files only)."""
        if self.writes_shared:
            self.sink.data(text.encode("utf-8"), self.file(name))

    def write_json(self, name: str, data: Any) -> None:
        """A small JSON file (written by the process that writes the shared files only)."""
        if self.writes_shared:
            state_io.write_json(self.sink, data, self.file(name))

    @contextlib.contextmanager
    def local_folder(self) -> Iterator[str]:
        """A folder of the local disk whose files become part of the checkpoint: the checkpoint's own staging
        folder on a disk, else a temporary one whose files are handed to the storage when the block ends."""
        local = self.storage.local_path(self.path)
        if local is not None:
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="trainkit-checkpoint-") as folder:
            yield folder
            for root, _dirs, files in os.walk(folder):
                for name in files:
                    path = os.path.join(root, name)
                    with open(path, "rb") as handle:
                        self.sink.data(handle.read(), self.file(os.path.relpath(path, folder).replace(os.sep, "/")))

    def write_engine_state(self, *, sharded: bool | None = None, dataloaders: Sequence[Any] | None = None) -> None:
        """Collective: the Accelerator's whole state (what ``save_state`` writes): models, optimizers,
        schedulers, loaders' positions, the scaler, registered objects, every process's random states."""
        from .accelerator_state import write_state_files

        write_state_files(self.accelerator, self.writing(), sharded, dataloaders)

    def write_save_state(self, *, sharded: bool | None = None, dataloaders: Sequence[Any] | None = None) -> None:
        """Collective: what ``save_state`` writes: the files of its pre-hooks (given a local folder that joins the
        checkpoint), then the engine's state."""
        from trainkit.engine.accelerator_parts.attributes import run_save_state_pre_hooks

        with self.local_folder() as folder:
            run_save_state_pre_hooks(self.accelerator, self.accelerator.prepared.models, folder)
        self.write_engine_state(sharded=sharded, dataloaders=dataloaders)

    def write_model(self, model: Any, index: int = 0) -> None:
        """Collective: one prepared model's weights only (full, or DCP shards where the strategy shards it)."""
        from .model_state import save_model

        strategy = self.accelerator.strategy
        save_model(strategy, model, self.writing(), index, strategy.checkpoint_is_sharded(model))
