"""Uploads to the Hugging Face Hub (``push_to_hub``), checked when the Trainer is created, not after training.

The repository is created (or found) up front: without network, without a token or without write access
the Trainer fails at construction with a message saying which, instead of after hours of training.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)


class HubUploadError(RuntimeError):
    """push_to_hub=True but the Hub cannot be reached or written to."""


class HubUploader:
    """Knows the target repository and uploads folders to it (main process only)."""

    def __init__(self, args, token: str | None = None, private: bool | None = None) -> None:
        self.args = args
        self.token = token if token is not None else args.hub_token
        self.private = private if private is not None else args.hub_private_repo
        self.repo_id = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))
        self.url = self._create_repo()

    def _create_repo(self) -> str:
        try:
            from huggingface_hub import HfApi
        except ImportError as error:  # pragma: no cover - huggingface_hub comes with transformers
            raise HubUploadError("push_to_hub=True needs the huggingface_hub package.") from error
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            raise HubUploadError("push_to_hub=True but HF_HUB_OFFLINE is set: unset it or pass push_to_hub=False.")
        api = HfApi(token=self.token)
        try:
            return str(api.create_repo(self.repo_id, private=self.private, exist_ok=True))
        except Exception as error:  # any failure here (DNS, HTTP, auth) means no upload would work later
            raise HubUploadError(
                f"push_to_hub=True but the Hub repository {self.repo_id!r} cannot be created or reached "
                f"({type(error).__name__}: {error}). Check the network and your token (`hf auth login` or "
                "hub_token), or pass push_to_hub=False; nothing was trained yet."
            ) from error

    def upload(self, folder: str, message: str, path_in_repo: str | None = None,
               ignore_patterns: list[str] | None = None, revision: str | None = None, token: str | None = None) -> Any:
        """Upload ``folder`` to the repository (into ``path_in_repo`` when given), without ``ignore_patterns``, to
        ``revision`` (default: ``hub_revision``); returns the Hub's commit information."""
        from huggingface_hub import HfApi

        info = HfApi(token=token if token is not None else self.token).upload_folder(
            repo_id=self.repo_id, folder_path=folder, path_in_repo=path_in_repo, commit_message=message,
            ignore_patterns=ignore_patterns, revision=revision if revision is not None else self.args.hub_revision,
        )
        logger.info("Uploaded %s to %s", folder, self.repo_id)
        return info


def write_model_card(trainer, **card_fields) -> str:
    """Write ``output_dir/README.md``: transformers' model card (TrainingSummary) drawn from the trainer's
    arguments, model config and log history; ``card_fields`` are create_model_card's (language, license,
    tags, model_name, finetuned_from, tasks, dataset_tags, dataset, dataset_args). Returns the path."""
    from transformers.modelcard import TrainingSummary

    summary = TrainingSummary.from_trainer(_CardView(trainer), **card_fields)
    path = os.path.join(trainer.args.output_dir, "README.md")
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(summary.to_model_card())
    return path


class _CardView:
    """The trainer as transformers' model-card code reads it: the same, except that ``args.lr_scheduler_type``
    is transformers' SchedulerType enum (trainkit keeps the plain string) and ``args.gradient_accumulation_steps``
    the run's (the engine's resolved value, which the launcher may have set)."""

    def __init__(self, trainer) -> None:
        self._trainer = trainer
        self.args = _EnumArgs(trainer.args, trainer.accelerator.gradient_accumulation_steps)

    def __getattr__(self, name: str):
        return getattr(self._trainer, name)


class _EnumArgs:
    def __init__(self, args, accumulation_steps: int) -> None:
        self._args = args
        self._accumulation_steps = accumulation_steps

    def __getattr__(self, name: str):
        if name == "gradient_accumulation_steps":
            return self._accumulation_steps
        value = getattr(self._args, name)
        if name == "lr_scheduler_type":
            from transformers.trainer_utils import SchedulerType

            return SchedulerType(value)
        return value
