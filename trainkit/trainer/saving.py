"""What the Trainer writes and reads back: the model, checkpoints, the best model, callback states, the Hub.

transformers' hooks of that concept as one mixin of :class:`~trainkit.Trainer`, called where transformers calls
them: ``_save_checkpoint(model, trial)`` → ``save_model(folder, _internal_call=True)`` → ``_save(folder)``;
``_load_from_checkpoint`` when training resumes, ``_load_best_model`` at the end of training.

``save_model`` writes what ``save_pretrained`` writes for a transformers model (or a PEFT model: its adapter),
the full weights gathered first where the strategy shards them (FSDP2, tensor parallelism); other models get
their full state as safetensors (one file, or shards and an index above 10GB). In a ``checkpoint-N`` folder
the weights are the engine's (exact, sharded where the strategy shards, written in the background with
``async_save``; see docs/checkpoints.md), and ``_save`` adds the rest: the model's config, the processing
class and the arguments.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from trainkit.engine import sharded_by_transformers

from .checkpointing import files as checkpoints
from .callbacks import TrainerControl, is_exportable

if TYPE_CHECKING:
    from torch import nn

    from trainkit.engine import Accelerator

    from .training_arguments.arguments import TrainingArguments
    from .callbacks import CallbackHandler, TrainerState
    from .checkpointing.manager import CheckpointManager
    from .hub import HubUploader

# a Trainer mixin's messages are the Trainer's: one logger for them all, as transformers' come from transformers.trainer
logger = logging.getLogger("trainkit.trainer.trainer")

MAX_SHARD_SIZE = "10GB"
"""Above this, weights that are not a transformers model's are written as shards and an index."""


def is_pretrained(model: Any) -> bool:
    """A transformers ``PreTrainedModel`` or a PEFT model: saved through its own ``save_pretrained``.

    Asked of the modules already imported: an instance of either class means its module was imported, so a plain
    ``nn.Module`` run (which never imports transformers) is answered without importing it (~0.3 s)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is not None and isinstance(model, modeling.PreTrainedModel):
        return True
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def gathered_state_dict(accelerator: Any, model: nn.Module) -> dict[str, Any] | None:
    """Collective: the full state dict of a model whose parameters are sharded (DTensors: FSDP2, tensor
    parallelism), complete on the main process; None for a model that holds its full weights itself."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    # FSDP2 leaves the root's parameters unsharded after a forward without backward (an evaluation): they are then
    # not DTensors, yet only FSDP's state-dict path reads them right.
    if not (any(isinstance(module, FSDPModule) for module in model.modules())
            or any(isinstance(parameter, DTensor) for parameter in model.parameters())):
        return None
    return accelerator.get_state_dict(model)


class SavingMethods:
    """transformers' saving, loading and Hub hooks (mixed into :class:`~trainkit.Trainer`)."""

    if TYPE_CHECKING:
        args: TrainingArguments
        accelerator: Accelerator
        model: nn.Module
        model_wrapped: nn.Module
        optimizer: Any
        lr_scheduler: Any
        processing_class: Any
        data_collator: Any
        state: TrainerState
        control: TrainerControl
        callback_handler: CallbackHandler
        checkpoint_manager: CheckpointManager
        hub: HubUploader | None
        hub_model_id: str | None
        _engine_saved_weights_to: str | None
        _trial: Any

        def _get_output_dir(self, trial: Any) -> str: ...
        def _prepare_model(self) -> None: ...
        def store_flos(self) -> None: ...
        def is_world_process_zero(self) -> bool: ...

    # ------------------------------------------------------------------ the model

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model so that ``from_pretrained(output_dir)`` loads it (default: ``args.output_dir``): see the
        module doc. Every process calls it; the main process writes. ``_internal_call``: a checkpoint's save (no
        Hub upload; a user's call uploads with ``push_to_hub=True``)."""
        output_dir = str(output_dir if output_dir is not None else self.args.output_dir)
        state_dict = None
        if output_dir != self._engine_saved_weights_to:  # a checkpoint's weights are already written
            self._prepare_model()
            if not sharded_by_transformers(self.accelerator.unwrap_model(self.model_wrapped)):  # it gathers itself
                state_dict = gathered_state_dict(self.accelerator, checkpoints.prepared_model(self))
        self._save(output_dir, state_dict=state_dict)
        self.accelerator.wait_for_everyone()
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        """Main process: the weights (``state_dict``, else the model's own), config, processing class and
        ``training_args.json`` into ``output_dir``; in a checkpoint the engine has written the weights already."""
        output_dir = str(output_dir if output_dir is not None else self.args.output_dir)
        model: Any = self.accelerator.unwrap_model(self.model_wrapped, keep_torch_compile=False)
        if not self.args.should_save:
            if output_dir != self._engine_saved_weights_to and sharded_by_transformers(model):
                model.save_pretrained(output_dir, is_main_process=False)  # gathering its shards is collective
            return
        os.makedirs(output_dir, exist_ok=True)
        logger.info("Saving the model to %s", output_dir)
        if output_dir == self._engine_saved_weights_to:
            checkpoints.save_model_config(model, output_dir)
        elif is_pretrained(model):
            model.save_pretrained(output_dir, state_dict=state_dict, is_main_process=True)
        else:
            from trainkit.engine import save_safetensors

            save_safetensors(state_dict if state_dict is not None else model.state_dict(), output_dir, MAX_SHARD_SIZE)
            checkpoints.save_model_config(model, output_dir)
        tokenizer = self.processing_class
        if tokenizer is None:  # transformers saves the data collator's tokenizer instead
            tokenizer = getattr(self.data_collator, "tokenizer", None)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(output_dir)
        with open(os.path.join(output_dir, checkpoints.TRAINING_ARGS_NAME), "w", encoding="utf-8") as handle:
            handle.write(self.args.to_json_string())

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load the weights of ``resume_from_checkpoint`` into ``model`` (default: the Trainer's), verifying the
        folder first; a checkpoint of another model names its missing, unexpected and mis-shaped keys."""
        self.checkpoint_manager.load_weights(resume_from_checkpoint, model if model is not None else self.model)

    def _load_best_model(self) -> None:
        """Load the weights of ``state.best_model_checkpoint`` (a best checkpoint that is gone or damaged is not
        loaded: a warning says so and the model keeps its last weights)."""
        self.checkpoint_manager.load_best_model()

    # ------------------------------------------------------------------ checkpoints and the trainer's state

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Write ``checkpoint-{global_step}`` (atomically, with the engine's state and this run's ``trainer_state.json``),
        then rotate and upload as the arguments say."""
        self.store_flos()
        self.checkpoint_manager.save()

    def save_state(self) -> None:
        """Write ``trainer_state.json`` to ``output_dir`` (main process)."""
        if self.is_world_process_zero():
            output_dir = str(self.args.output_dir)
            os.makedirs(output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(output_dir, checkpoints.TRAINER_STATE_NAME))

    def _load_callback_state(self) -> None:
        """With ``restore_callback_states_from_checkpoint``: rebuild each stateful callback (and the
        :class:`TrainerControl`) from ``state.stateful_callbacks``, as transformers does: the restored callbacks
        move to the end of the list; stored states of callbacks this run lacks are named in a warning."""
        if not self.args.restore_callback_states_from_checkpoint:
            return
        present = self.callback_handler.callbacks + [self.control]
        missing, restored = [], []
        for name, saved in self.state.stateful_callbacks.items():
            matching = [obj for obj in present if type(obj).__name__ == name]
            if not matching:
                missing.append(name)
                continue
            for current, state in zip(matching, saved if isinstance(saved, list) else [saved]):
                rebuilt = type(current)(**state.get("args", {}))
                for attribute, value in state.get("attributes", {}).items():
                    setattr(rebuilt, attribute, value)
                if isinstance(rebuilt, TrainerControl):
                    self.control = rebuilt
                else:
                    self.callback_handler.remove_callback(type(rebuilt))
                    restored.append(rebuilt)
        for callback in restored:
            self.callback_handler.add_callback(callback)
        if missing:
            names = ", ".join(missing)  # in the message itself, as transformers writes it (filters read record.msg)
            logger.warning(f"The checkpoint holds the states of callbacks this run does not have: {names}.")

    def _stateful_callbacks(self) -> list[Any]:
        """The objects whose states ``trainer_state.json`` stores: the exportable callbacks (trainkit's or
        transformers' ExportableState) and the control."""
        return [obj for obj in self.callback_handler.callbacks + [self.control] if is_exportable(obj)]

    def compare_trainer_and_checkpoint_args(self, training_args: TrainingArguments, trainer_state: Any) -> None:
        """Warn about the step intervals and batch size that differ between ``training_args`` and a resumed
        ``trainer_state`` (this run's values are used)."""
        for name in ("logging_steps", "eval_steps", "save_steps", "train_batch_size"):
            current = getattr(training_args, "per_device_train_batch_size" if name == "train_batch_size" else name)
            saved = getattr(trainer_state, name, None)
            if saved is not None and current is not None and current != saved:
                logger.warning("The checkpoint was trained with %s=%s; this run uses %s.", name, saved, current)

    # ------------------------------------------------------------------ model card and the Hub

    def create_model_card(self, language: str | None = None, license: str | None = None,  # noqa: A002 - transformers' name
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None:
        """Write a draft model card (``README.md``) to ``output_dir`` from the run (main process)."""
        if self.is_world_process_zero():
            from . import hub

            hub.write_model_card(self, language=language, license=license, tags=tags, model_name=model_name,
                                 finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags,
                                 dataset=dataset, dataset_args=dataset_args)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create (or find) the Hub repository ``hub_model_id`` (default: ``output_dir``'s name); fails now, with
        the reason, when the Hub cannot be reached or written to."""
        from .hub import HubUploader

        self.hub = HubUploader(self.args, token=token, private=private)
        self.hub_model_id = self.hub.repo_id

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model and a model card (``kwargs`` as :meth:`create_model_card`'s) in ``output_dir`` and upload
        it (without the checkpoints) to the Hub; returns the upload's commit information (main process)."""
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        if not blocking:
            logger.info("push_to_hub(blocking=False): trainkit uploads synchronously; this returns once uploaded.")
        if self.hub is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        output_dir = str(self.args.output_dir)
        repo_name = self.args.hub_model_id or os.path.basename(os.path.normpath(output_dir))
        kwargs.setdefault("model_name", repo_name.split("/")[-1])
        self.create_model_card(**kwargs)
        assert self.hub is not None
        return self.hub.upload(output_dir, commit_message or "End of training",
                               ignore_patterns=["_*", f"{checkpoints.PREFIX}*"], revision=revision, token=token)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Upload a committed checkpoint as ``hub_strategy`` says (main process; not with ``hub_strategy="end"``):
        into its own folder of the repository (``checkpoint``, ``all_checkpoints``) or its top level."""
        args = self.args
        if self.hub is None or not self.is_world_process_zero() or args.hub_strategy == "end":
            return
        self.callback_handler.on_push_begin(args, self.state, self.control)
        name = os.path.basename(os.path.normpath(checkpoint_folder))
        in_repo = name if args.hub_strategy in ("checkpoint", "all_checkpoints") else None
        ignored = None if args.hub_strategy == "all_checkpoints" else list(checkpoints.TRAINING_STATE_PATTERNS)
        step = name.removeprefix(checkpoints.PREFIX)  # the checkpoint's step (a background upload runs later)
        self.hub.upload(checkpoint_folder, f"Training in progress, step {step}", path_in_repo=in_repo,
                        ignore_patterns=ignored)

    def _finish_current_push(self) -> None:
        """Wait for an upload in progress: none ever is, trainkit's uploads finish before they return."""
