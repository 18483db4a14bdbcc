"""The one checkpointer of an Accelerator: every checkpoint is written, found, verified, rotated and loaded here.

``Accelerator.save_state`` / ``load_state`` and the Trainer's ``checkpoint-N`` folders use the same object
(``accelerator.checkpointer``), so staging, the commit, verification, rotation (``total_limit``,
``save_total_limit``), the fallback past a damaged checkpoint and the background writer of ``async_save`` live
here once. A caller says *what* to write (a function that fills a :class:`~.staged.StagedCheckpoint`) and *where*;
the checkpointer decides *how*: which storage backend the location belongs to (:mod:`.storage`), which processes
take part (every process in one shared place, each node's processes in their own folder, or the main process
alone), and whether the files are written now or captured and written by the background writer (an explicit
:class:`~.async_writer.BackgroundCheckpointWriter`, whose staging memory is set up before the first save is due).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from trainkit.config.checkpointing import ASYNC_SAVE_WHEN_BUSY

from .errors import CheckpointError, CorruptedCheckpointError, IncompleteCheckpointError
from .rendezvous import SaveRendezvous
from .resume_folder import FolderConvention, find_resume_folder
from .state_io import read_json
from .storage.base import CheckpointStorage
from .storage.node_local import NodeLocalStorage
from .storage.ranks import Ranks
from .storage.registry import local_path, storage_for
from .storage.shared_folder import SharedFolderStorage

# The writers (async_writer, sinks, staged) and the state readers (model_state, accelerator_state) are imported
# where a save or a load uses them: a run that neither saves nor resumes only asks where a checkpoint would be
# (train() looks for one to resume from), and reaches its first step without them (benchmarks/first_step.py).
if TYPE_CHECKING:
    from .async_writer import AfterCommit, BackgroundCheckpointWriter
    from .global_batch import BatchShape
    from .model_state import Reading
    from .protocol import CheckpointedAccelerator
    from .sinks import FileSink
    from .staged import StagedCheckpoint
    from .warmup import StagingAhead

logger = logging.getLogger(__name__)

WriteCheckpoint = Callable[["StagedCheckpoint"], None]
"""Fills a staged checkpoint (called on every process taking part)."""


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What :meth:`Checkpointer.resume` restored."""

    folder: str
    engine_state: bool
    """True when the engine's whole state was loaded; False: the model's weights only (``save_only_model``)."""
    files: dict[str, Any]
    """The JSON files asked for, by name (None for one the checkpoint does not hold)."""


class Checkpointer:
    """Writes and reads one Accelerator's checkpoints (see the module doc)."""

    def __init__(self, accelerator: CheckpointedAccelerator) -> None:
        self._accelerator = accelerator
        self.storage: CheckpointStorage | None = None
        """A backend for every checkpoint of this Accelerator; None: chosen by location (a folder, a URL)."""
        self.writer: BackgroundCheckpointWriter | None = None
        """The background writer while ``async_save`` is on (made with the first prepared object or save)."""
        self.loaded_from: str | None = None
        """The checkpoint ``load_state`` last loaded (automatic rotation never deletes it)."""
        self.rendezvous = SaveRendezvous()
        self._told_per_rank = False
        self._holder_groups: dict[tuple[Any, ...], Any] = {}
        self._ahead: StagingAhead | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its Accelerator (Accelerate scripts pickle it): settings only, no thread, group or memory."""
        state = dict(self.__dict__)
        state.update(writer=None, _holder_groups={}, _ahead=None)
        return state

    # -- where ----------------------------------------------------------------------------------------------------
    def storage_for(self, location: str) -> CheckpointStorage:
        """The backend of ``location``: the one set on this checkpointer, else by its form (a folder, each
        machine's own disk with ``save_on_each_node``, an object-store URL; an unknown ``scheme://`` is refused)."""
        if self.storage is not None:
            return self.storage
        per_node = bool(getattr(self._accelerator.project_configuration, "save_on_each_node", False))
        return storage_for(location, per_node=per_node)

    def place(self, location: str | os.PathLike, ranks: Ranks | None = None) -> tuple[CheckpointStorage, str, Ranks]:
        """Collective: ``(storage, location, processes taking part)``. Processes that name different folders
        each keep their part in their own (as Accelerate's per-process ``save_state(folder)`` does)."""
        location = local_path(os.fspath(location))
        storage = self.storage_for(location)
        location = storage.normalize(location)
        ranks = ranks or Ranks.everyone()
        if type(storage) is SharedFolderStorage and not ranks.solo and self.storage is None:
            folders = ranks.gather_all(os.path.abspath(location))
            if len(set(folders)) > 1:
                storage = NodeLocalStorage(by_machine=False)
                if not self._told_per_rank and ranks.me == 0:
                    self._told_per_rank = True
                    logger.info("Checkpoints: the processes name different folders, so each writes and reads its "
                                "part in its own folder (docs/checkpoints.md, each node's own disk).")
        return storage, location, storage.participants(location, ranks)

    def _dcp_group(self, storage: CheckpointStorage, ranks: Ranks, background: Any = None) -> Any:
        """The process group sharded writes and reads run on: every process (the loop's group or the writer's),
        or, with each node's own folder, the node's processes (groups made by every process, in one order)."""
        holders = getattr(storage, "holders", ())
        if ranks.solo or len(holders) < 2:
            return background
        import torch.distributed as dist

        key = (holders, background is not None)
        if key not in self._holder_groups:
            made = {holder: dist.new_group(list(holder), backend="gloo" if background is not None else None)
                    for holder in holders}
            self._holder_groups[key] = made
        return self._holder_groups[key][ranks.members]

    # -- the background writer -------------------------------------------------------------------------------------
    def background_writer(self) -> BackgroundCheckpointWriter | None:
        """The writer of ``async_save`` (made on first use), or None when saves are synchronous."""
        config = self._accelerator.project_configuration
        if not getattr(config, "async_save", False):
            return None
        if self.writer is None:
            from .async_writer import BackgroundCheckpointWriter

            when_busy = getattr(config, "async_save_when_busy", ASYNC_SAVE_WHEN_BUSY.default)  # parsed by the config
            self.writer = BackgroundCheckpointWriter(when_busy)
        return self.writer

    def flush(self) -> None:
        """Wait for the save in flight (if any) and raise its error."""
        if self.writer is not None:
            self.writer.flush()

    # -- writing ----------------------------------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike, write: WriteCheckpoint, *, metadata: dict[str, Any] | None = None,
             replace: bool = False, set_aside_damaged: bool = False, after_commit: AfterCommit | None = None,
             synchronous: bool = False, ranks: Ranks | None = None) -> str | None:
        """Collective: write the checkpoint ``folder`` atomically, filled by ``write``; return it (None: skipped,
        another save being in flight with ``async_save_when_busy="skip"``).

        With ``async_save`` it is captured now and written by the background writer; ``synchronous`` writes it
        before returning anyway (a save in flight is finished first, so checkpoints become visible in order).
        ``replace``: a complete checkpoint there is replaced once this one is committed; ``set_aside_damaged``: one
        that does not verify is kept aside (names the caller owns). ``after_commit`` runs once it is visible, on the
        process that wrote its shared files (one per folder holder).
        ``ranks``: the processes taking part (default: every process)."""
        from .sinks import WriteNow
        from .staged import StagedCheckpoint

        storage, final_dir, ranks = self.place(folder, ranks)
        metadata = self._with_layout(storage, ranks, metadata)
        full_everywhere = len(getattr(storage, "holders", ())) > 1

        def capture(sink: FileSink, staging: str) -> None:
            write(StagedCheckpoint(staging, sink, ranks.is_leader, self._accelerator, full_everywhere))

        writer = None if synchronous else self.background_writer()
        if writer is not None:
            background = writer.writer_ranks(ranks)
            return writer.save(storage, ranks, final_dir, capture, metadata=metadata, replace=replace,
                               set_aside_damaged=set_aside_damaged, after_commit=after_commit,
                               dcp_group=self._dcp_group(storage, ranks, background.group),
                               writes_shared=ranks.is_leader)
        self.flush()
        staging = storage.stage(final_dir, replace=replace, set_aside_damaged=set_aside_damaged, ranks=ranks)
        try:
            capture(WriteNow(storage, self._dcp_group(storage, ranks)), staging)
        except Exception as error:
            with contextlib.suppress(CheckpointError):  # tell the other ranks, so none waits in the commit forever
                storage.commit(staging, final_dir, error=error, ranks=ranks)
            raise
        storage.commit(staging, final_dir, metadata=metadata, ranks=ranks)
        if after_commit is not None and ranks.is_leader:  # as the background writer: where the shared files went
            after_commit(final_dir)
        return final_dir

    @staticmethod
    def _with_layout(storage: CheckpointStorage, ranks: Ranks, metadata: dict[str, Any] | None) -> dict[str, Any]:
        """The metadata, with each node's own folder: which processes wrote which folder, and one token that
        ties the nodes' parts of this checkpoint together."""
        metadata = dict(metadata or {})
        holders = getattr(storage, "holders", ())
        if len(holders) > 1:
            metadata["holders"] = [list(holder) for holder in holders]
            metadata["commit"] = ranks.gather_all(uuid.uuid4().hex)[0]
        return metadata

    def rotate(self, run_dir: str, keep: int | None, protected: Iterable[str | None] = (),
               convention: FolderConvention | None = None, prefix: str = "checkpoint_") -> list[str]:
        """One process (of each node, with each node's own folder): delete the oldest complete checkpoints beyond
        ``keep`` under ``run_dir``, never the newest nor ``protected``."""
        storage = self.storage_for(run_dir)
        if convention is not None:
            run_dir, prefix = storage.join(run_dir, convention.subfolder) if convention.subfolder else run_dir, \
                convention.prefix
        return storage.rotate(run_dir, keep, protected, prefix)

    # -- finding and reading ---------------------------------------------------------------------------------------
    def find_resume_folder(self, requested: str | os.PathLike | bool | None, run_dir: str | None, *,
                           conventions: Sequence[FolderConvention], latest_when_unset: bool = False,
                           automatic_reason: str | None = None) -> str | None:
        """Collective: the checkpoint to resume from (see :func:`.resume_folder.find_resume_folder`), looked for
        and verified where the checkpoints are stored."""
        where = run_dir if not isinstance(requested, (str, os.PathLike)) or isinstance(requested, bool) else requested
        if where is None:
            return find_resume_folder(requested, run_dir, conventions=conventions, latest_when_unset=latest_when_unset,
                                      automatic_reason=automatic_reason)
        storage, _, ranks = self.place(where)
        return find_resume_folder(requested, None if run_dir is None else local_path(run_dir),
                                  conventions=conventions, latest_when_unset=latest_when_unset,
                                  automatic_reason=automatic_reason, io=storage, ranks=ranks)

    def open(self, folder: str | os.PathLike, *, checksums: bool = True) -> Reading:
        """Collective: verify the checkpoint ``folder`` (sizes, and SHA-256 unless ``checksums=False``) and return
        where its files are read from; raises before anything is loaded when it is damaged or incomplete."""
        from .model_state import Reading

        storage, location, ranks = self.place(folder)
        manifest = storage.read(location, checksums=checksums, ranks=ranks)
        self._check_one_commit(location, manifest, ranks)
        return Reading(storage, storage.files_at(location, manifest), self._dcp_group(storage, ranks),
                       manifest.get("metadata", {}))

    @staticmethod
    def _check_one_commit(folder: str, manifest: dict[str, Any], ranks: Ranks) -> None:
        """With each node's own folder: the folders read together hold parts of one checkpoint."""
        if ranks.solo or ranks.size == ranks.world:
            return
        tokens = ranks.gather_all(manifest.get("metadata", {}).get("commit"))
        if len(set(tokens)) > 1:
            raise CheckpointError(f"The processes' folders ({folder} here) hold parts of different checkpoints "
                                  "(their manifests name different commits); nothing was loaded.")

    @staticmethod
    def decide(action: str, function: Callable[[], Any]) -> Any:
        """Collective: run ``function`` on rank 0 and give every process its result (or its error)."""
        return Ranks.everyone().decide(action, function)

    def _files_of(self, folder: str) -> tuple[CheckpointStorage, str]:
        """One process: the storage of ``folder`` and where its files are (its manifest's root; the folder itself
        when it has no manifest)."""
        storage = self.storage_for(folder)
        try:
            return storage, storage.files_at(local_path(folder))
        except (IncompleteCheckpointError, CorruptedCheckpointError):
            return storage, storage.normalize(local_path(folder))

    def is_checkpoint(self, folder: str) -> bool:
        """One process: whether ``folder`` is a complete checkpoint (cheap: sizes only)."""
        return self.storage_for(folder).is_complete(local_path(folder))

    def read_json(self, folder: str, name: str) -> Any:
        """One process: the JSON file ``name`` of a checkpoint (where its manifest puts the files), or None."""
        storage, files = self._files_of(folder)
        path = storage.join(files, name)
        return read_json(storage, path) if storage.exists(path) else None

    def saved_batch_shape(self, folder: str, accumulation: int | None = None,
                          accumulation_from: str | None = None) -> BatchShape | None:
        """One process: the global batch a checkpoint was saved with (None when it holds no engine state).
        ``accumulation`` / ``accumulation_from``: the caller's own record of the accumulation, given, or read from its
        JSON file in the checkpoint (``gradient_accumulation_steps``; None when that file or field is missing)."""
        from .global_batch import saved_batch_shape

        storage, files = self._files_of(folder)
        if accumulation_from is not None:
            path = storage.join(files, accumulation_from)
            accumulation = (read_json(storage, path) if storage.exists(path) else {}).get("gradient_accumulation_steps")
            if accumulation is None:
                return None
        return saved_batch_shape(storage, files, accumulation=accumulation)

    def rescale_for_global_batch(self, folder: str, dataloader: Any, *, accumulation_from: str | None = None) -> None:
        """Before resuming from ``folder`` on another world size: the accumulation that keeps its global batch becomes
        the run's (``gradient_accumulation_steps`` and ``config``, with provenance; refused where it does not divide),
        said once. The same decision (``global_batch.keep_global_batch``) and application as inside ``load_state``;
        the Trainer asks for it before it plans its run, then loads with ``keep_global_batch=False``.
        ``accumulation_from``: see :meth:`saved_batch_shape`."""
        from .accelerator_state import rescale_accumulation

        saved = self.saved_batch_shape(folder, accumulation_from=accumulation_from)
        if saved is not None:
            rescale_accumulation(self._accelerator, saved, getattr(dataloader, "global_batch_size", None), folder)

    def load_model(self, model: Any, folder: str, index: int = 0, *, checksums: bool = True) -> None:
        """Collective: verify ``folder`` and load its ``index``-th model's weights (full or sharded) into the
        prepared ``model``, keys checked before anything is copied."""
        from .model_state import prepare_model_load

        reading = self.open(folder, checksums=checksums)
        prepare_model_load(self._accelerator.strategy, model, reading, index).apply()


    # -- the Accelerator's state: save_state / load_state ----------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike | None = None, *, sharded: bool | None = None,
                   dataloaders: Sequence[Any] | None = None, synchronous: bool = False) -> str | None:
        """``Accelerator.save_state``: write every prepared object's state atomically; return the folder.

        Called on every process, or (unsharded state) on the main process only, which then saves alone without
        waiting (:mod:`.rendezvous`). An explicit ``output_dir`` holding a complete checkpoint is replaced once the
        new one is committed. With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
        ``project_dir/checkpoints/checkpoint_{iteration}``; afterwards the iteration advances and the oldest complete
        checkpoints beyond ``total_limit`` are deleted (never the newest nor the one resumed from). Returns None when
        the save was skipped (a save in flight with ``async_save_when_busy="skip"``, or this process came after the
        main process had saved alone)."""
        from .accelerator_state import needs_every_process
        from .resume_folder import ACCELERATOR_CONVENTION

        accelerator = self._accelerator
        config = accelerator.project_configuration
        automatic = config.automatic_checkpoint_naming
        if automatic and output_dir is not None:
            logger.warning("save_state(%r) with automatic_checkpoint_naming: the checkpoint goes to the automatic "
                           "folder under project_dir, and the folder given is not used (as in Accelerate).", output_dir)
        if automatic:
            if config.project_dir is None:
                raise ValueError("save_state with automatic_checkpoint_naming needs a project_dir "
                                 "(Accelerator(project_dir=...)).")
            project = local_path(config.project_dir)
            output_dir = self.storage_for(project).join(project, ACCELERATOR_CONVENTION.subfolder,
                                                         f"{ACCELERATOR_CONVENTION.prefix}{config.iteration}")
        elif output_dir is None:
            raise ValueError("save_state needs an output_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
        self.storage_for(local_path(os.fspath(output_dir)))  # an unknown scheme:// is refused before anything else
        ranks = self.rendezvous.take_part(needs_every_process(accelerator, sharded, dataloaders))
        if ranks is None:
            return None
        protected = self.loaded_from  # read now: the rotation may run later, on the writer's thread

        def rotate(folder: str) -> None:
            if automatic and config.total_limit:
                self.storage_for(folder).rotate(os.path.dirname(folder), config.total_limit, protected=[protected],
                                                prefix=ACCELERATOR_CONVENTION.prefix)

        # An explicit folder may be saved to again (a common Accelerate habit): the new checkpoint replaces the old
        # one once committed, never by writing into it. Automatically named ones are never replaced, except a damaged
        # one (skipped by the resume that led here), kept aside as checkpoint_N.damaged-*.
        saved = self.save(output_dir, lambda staged: staged.write_save_state(sharded=sharded, dataloaders=dataloaders),
                          metadata={"kind": "accelerator_state"}, replace=not automatic, set_aside_damaged=automatic,
                          after_commit=rotate, synchronous=synchronous, ranks=ranks)
        if saved is None:
            return None
        if automatic:
            config.iteration += 1
            if (self.background_writer() is None or synchronous) and not ranks.solo:
                accelerator.wait_for_everyone()  # the rotation is done before any rank goes on
        return saved

    def load_state(self, input_dir: str | os.PathLike | None = None, *, verify_checksums: bool = True,
                   dataloaders: Sequence[Any] | None = None, keep_global_batch: bool = True,
                   require_all_objects: bool = False) -> str | None:
        """``Accelerator.load_state``: restore what :meth:`save_state` wrote; return the folder loaded.

        With no ``input_dir`` and automatic naming, the newest checkpoint that verifies is used (newer incomplete or
        damaged ones are skipped with a warning); none is an error, except after a torchelastic restart (the
        unchanged script running again), where nothing is loaded (returns None). Nothing changes unless the whole
        checkpoint is sound and fits. Fewer prepared objects than saved: what is prepared is loaded, and one line
        names the rest (``require_all_objects=True``: refused). On another world size the accumulation is rescaled
        to keep the global batch (``keep_global_batch=False``: the caller owns the accumulation, as the Trainer)."""
        from .resume_folder import ACCELERATOR_CONVENTION, elastic_reason

        accelerator = self._accelerator
        self.rendezvous.decline()
        self.flush()  # a save still in flight is finished (and visible) before anything is read
        automatic = accelerator.project_configuration.automatic_checkpoint_naming
        if input_dir is None and not automatic:
            raise ValueError("load_state needs an input_dir (or ProjectConfiguration(automatic_checkpoint_naming=True)).")
        run_dir = accelerator.project_configuration.project_dir if input_dir is None else None
        if input_dir is None and run_dir is None:
            raise ValueError("load_state with automatic_checkpoint_naming needs a project_dir "
                             "(Accelerator(project_dir=...)).")
        folder = self.find_resume_folder(input_dir, run_dir, conventions=[ACCELERATOR_CONVENTION],
                                         latest_when_unset=True, automatic_reason=elastic_reason(accelerator.config.elastic))
        if folder is None:
            return None
        # Found automatically (no input_dir): the finder has just checksummed it; sizes are checked again here.
        reading = self.open(folder, checksums=verify_checksums and input_dir is not None)
        self._load_engine_state(reading, folder, require_all_objects=require_all_objects, dataloaders=dataloaders,
                                keep_global_batch=keep_global_batch)
        return folder

    def resume(self, folder: str, *, model: Any = None, read: Sequence[str] = (), verify_checksums: bool = True,
               dataloaders: Sequence[Any] | None = None, keep_global_batch: bool = True,
               load_models: bool = True) -> Resumed:
        """Collective: "resume from ``folder``". It is verified once, then the engine's whole state is restored from
        it, or, from a checkpoint of weights only (``save_only_model``), ``model``'s weights; the JSON files named
        in ``read`` (the caller's own: ``trainer_state.json``) are returned. Nothing is changed when it is damaged
        or does not fit. ``load_models=False``: the weights are left to the caller (the Trainer's
        ``_load_from_checkpoint`` hook), everything else is restored."""
        from .accelerator_state import STATE_FILE

        self.flush()  # a save still in flight is finished (and visible) before anything is read
        reading = self.open(folder, checksums=verify_checksums)
        engine_state = reading.storage.exists(reading.path(STATE_FILE))
        if engine_state:
            self._load_engine_state(reading, folder, dataloaders=dataloaders, keep_global_batch=keep_global_batch,
                                    load_models=load_models)
        elif model is not None and load_models:
            from .model_state import prepare_model_load

            prepare_model_load(self._accelerator.strategy, model, reading, 0).apply()
        files = {}
        for name in read:
            path = reading.path(name)
            files[name] = read_json(reading.storage, path) if reading.storage.exists(path) else None
        return Resumed(folder, engine_state, files)

    def _load_engine_state(self, reading: Reading, folder: str, **options: Any) -> None:
        from .accelerator_state import load_state_files

        self._check_layout(reading, self._accelerator.process_index)
        load_state_files(self._accelerator, reading, folder, **options)
        self.loaded_from = folder

    @staticmethod
    def _check_layout(reading: Reading, rank: int) -> None:
        """A checkpoint written with each node's own folder loads where every process finds its parts in its
        folder: its random states, and (sharded state) the same processes per folder as when it was written."""
        saved = reading.metadata.get("holders")
        if not saved:
            return
        storage = reading.storage
        needs = [] if storage.exists(reading.path(f"random_states_{rank}.json")) else [f"random_states_{rank}.json"]
        current = [list(holder) for holder in getattr(storage, "holders", ())]
        if current != saved:
            sharded = [name for name in storage.list_names(reading.directory)
                       if name.startswith(("pytorch_model_fsdp_", "optimizer_")) and "." not in name]
            needs += [f"the other processes' shards of {name}/" for name in sharded]
        if needs:
            from .storage.node_local import layout_error

            raise layout_error(reading.directory, saved, rank, needs)

    # -- ahead of the first save -----------------------------------------------------------------------------------
    def prepare_ahead(self, *, step_done: bool = False) -> None:
        """With ``async_save``: set up what the first save would otherwise pay for while the loop waits (the
        writer's process group; staging memory for the models' state, and once the optimizers hold state, for
        theirs). Called when objects are prepared (collective there) and, cheaply, at every ``backward``."""
        writer = self.background_writer()
        if writer is None:
            return
        from .warmup import StagingAhead, reserve_staging

        if self._ahead is None:
            self._ahead = StagingAhead()
        reserve_staging(self._accelerator, writer, self._ahead, step_done=step_done)

    def on_step(self) -> None:
        """At every ``backward`` (cheap): raise a failed background write's error; reserve staging memory for the
        optimizers' state once it exists."""
        if self.writer is None:
            return
        self.writer.raise_pending_error()
        if self._ahead is not None and self._ahead.pending(self._accelerator):
            self.prepare_ahead(step_done=True)
