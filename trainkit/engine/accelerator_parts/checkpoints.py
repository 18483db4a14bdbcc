"""The checkpoint part of Accelerate's ``Accelerator`` API: ``save_state``, ``load_state``, the checkpointer and its
storage.

Every checkpoint goes through one object, ``accelerator.checkpointer``
(:class:`~trainkit.engine.checkpoint.checkpointer.Checkpointer`), made on first use: this mixin forwards
Accelerate's calls to it, checks their keywords (one that trainkit does not apply is named in a one-line notice,
never dropped silently) and gives the loop's hooks (a failed background write raised at ``backward``, staging memory
reserved ahead of the first asynchronous save, a main-process-only ``save_state`` declined by the other processes).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainkit.engine.checkpoint.checkpointer import Checkpointer
    from trainkit.engine.checkpoint.storage.base import CheckpointStorage

logger = logging.getLogger("trainkit.engine.accelerator")

SAVE_KEYWORDS = ("sharded", "dataloaders", "synchronous")
LOAD_KEYWORDS = ("verify_checksums", "dataloaders", "keep_global_batch", "require_all_objects")


class CheckpointAPI:
    """``save_state``, ``load_state`` and the checkpointer of an Accelerator (see the module doc)."""

    _checkpointer: Checkpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The one object every checkpoint of this Accelerator goes through (``save_state``, ``load_state``, the
        Trainer's ``checkpoint-N``): storage, commit, verification, rotation, the background writer."""
        if self._checkpointer is None:
            from trainkit.engine.checkpoint.checkpointer import Checkpointer

            self._checkpointer = Checkpointer(self)  # type: ignore[arg-type]  # a mixin: the Accelerator it is part of
        return self._checkpointer

    @property
    def checkpoint_storage(self) -> CheckpointStorage | None:
        """The storage backend every checkpoint goes to; None (the default): chosen by location (a folder, each
        machine's own disk with ``save_on_each_node``, an object-store URL such as ``s3://bucket/run``)."""
        return self.checkpointer.storage

    @checkpoint_storage.setter
    def checkpoint_storage(self, storage: CheckpointStorage | None) -> None:
        self.checkpointer.storage = storage

    checkpoint_io = checkpoint_storage
    """The earlier name of :attr:`checkpoint_storage`."""

    @property
    def loaded_checkpoint(self) -> str | None:
        """The folder ``load_state`` last loaded (automatic rotation never deletes it), else None."""
        return None if self._checkpointer is None else self._checkpointer.loaded_from

    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
                   **save_model_func_kwargs: Any) -> str | None:
        """Write models, optimizers, schedulers, dataloader positions, RNG and registered objects (always
        safetensors and JSON: ``safe_serialization=False`` is noted and changes nothing), atomically, to a folder or
        an object-store URL (``s3://bucket/run/ckpt``).

        Called on every process, or on the main process only for unsharded training (it then saves alone, as in
        Accelerate; a sharded state saved that way is refused). With ``ProjectConfiguration(async_save=True)`` this
        returns once the state is staged in host memory and the checkpoint appears when the background writer has
        committed it (docs/checkpoints.md); ``synchronous=True`` writes it before returning. ``sharded=True/False``
        overrides the strategy's format; ``dataloaders=[...]`` stores those loaders' positions only. None: skipped."""
        if not safe_serialization:
            logger.warning("save_state(safe_serialization=False): trainkit checkpoints are always safetensors + JSON.")
        known = _known(save_model_func_kwargs, SAVE_KEYWORDS, "save_state")
        return self.checkpointer.save_state(output_dir, **known)

    def load_state(self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None,
                   **load_model_func_kwargs: Any) -> None:
        """Restore what ``save_state`` wrote (the newest complete checkpoint when no path is given, with automatic
        naming), from a folder or an object-store URL. Objects not prepared in this run (an evaluation script that
        prepares only the model) are not loaded, and one line names them; ``require_all_objects=True`` refuses such a
        checkpoint instead. ``verify_checksums=False`` checks sizes only.

        Dataloaders get back their epoch; their position inside it only with
        ``DataLoaderConfiguration(use_stateful_dataloader=True)`` (else call ``skip_first_batches``).
        """
        if load_kwargs:
            logger.warning("load_state(load_kwargs=%s): trainkit loads no pickles, so there is no torch.load to "
                           "pass them to; they change nothing.", sorted(load_kwargs))
        known = _known(load_model_func_kwargs, LOAD_KEYWORDS, "load_state")
        self.checkpointer.load_state(input_dir, **known)

    # -- the loop's hooks ------------------------------------------------------------------------------------------
    def _checkpoints_at_step(self) -> None:
        """At every ``backward``: a failed background write stops the loop here; staging memory for the optimizers'
        state is reserved once it exists."""
        if self._checkpointer is not None:
            self._checkpointer.on_step()

    def _checkpoints_after_prepare(self) -> None:
        """After ``prepare`` (collective): the other processes' watcher for main-process-only saves; with
        ``async_save``, what the first save would pay for is set up ahead."""
        if self.num_processes > 1:  # type: ignore[attr-defined]  # the Accelerator's
            self.checkpointer.rendezvous.watch()
        if getattr(self.project_configuration, "async_save", False):  # type: ignore[attr-defined]  # the Accelerator's
            self.checkpointer.prepare_ahead()

    def _checkpoints_at_end(self) -> None:
        """``end_training``: the save in flight is finished (its error raised); no ``save_state`` is joined now."""
        if self._checkpointer is not None:
            self._checkpointer.flush()
        self._checkpoints_not_saving()

    def _checkpoints_not_saving(self) -> None:
        """A barrier, ``end_training``: this process is not in a ``save_state`` the main process may have opened."""
        if self.num_processes > 1:  # type: ignore[attr-defined]  # the Accelerator's
            self.checkpointer.rendezvous.watch()
            self.checkpointer.rendezvous.decline()


def _known(kwargs: dict[str, Any], known: tuple[str, ...], where: str) -> dict[str, Any]:
    """The keywords trainkit applies; the others (Accelerate passes them to DeepSpeed or ``load_state_dict``) are
    named in one notice."""
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        logger.warning("%s(%s): not applied by trainkit (it takes %s); they change nothing.", where,
                       ", ".join(f"{name}=" for name in unknown), ", ".join(known))
    return {name: value for name, value in kwargs.items() if name in known}
