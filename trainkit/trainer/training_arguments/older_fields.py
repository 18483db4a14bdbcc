"""Fields of older transformers releases that later ones dropped: accepted with the older meaning.

transformers 5.1's ``TrainingArguments`` still has ``warmup_ratio``, ``group_by_length`` and ``logging_dir``; the
newest release trainkit knows (:data:`~trainkit.trainer.training_arguments.fields.NEWEST_KNOWN_TRANSFORMERS`) has replaced
them. trainkit declares >= 5.1, so a script written against 5.1 runs after changing its import: each older field
is mapped onto the one field (or tracker setting) that carries its concept now, with a one-line notice naming the
mapping, and setting both spellings to different values is an error instead of one silently winning.

- ``warmup_ratio=r`` (5.1: copied into ``warmup_steps``) -> ``warmup_steps=r``, whose value below 1 is a ratio of
  the total steps in every 5.x release;
- ``group_by_length=True`` -> ``train_sampling_strategy="group_by_length"`` (length-grouped training and
  evaluation batches, as both releases do);
- ``logging_dir=path`` -> the folder of the TensorBoard event files (``report_to`` with ``tensorboard``). transformers
  5.1 only warns about it (its TensorBoard callback reads ``TENSORBOARD_LOGGING_DIR``); 4.x, and the field's own
  help text, make it the TensorBoard folder, which is what a script setting it asks for.
"""

from __future__ import annotations

import os
from typing import Any

from trainkit.config.errors import ConfigError

WHERE = "TrainingArguments"
OLDER_RELEASE = "transformers 5.1"
"""The oldest transformers trainkit declares, whose fields these are."""
DEFAULT_SAMPLING = "random"
"""``train_sampling_strategy``'s default, which ``group_by_length=True`` may replace."""


def apply_older_fields(args: Any, notice: Any) -> None:
    """Map the older fields set in ``args`` onto their current spelling; ``notice(line)`` reports each mapping once.

    Called before the current fields are checked, so the mapped values go through the same checks."""
    _apply_warmup_ratio(args, notice)
    _apply_group_by_length(args, notice)
    _apply_logging_dir(args, notice)


def _apply_warmup_ratio(args: Any, notice: Any) -> None:
    ratio = args.warmup_ratio
    if ratio is None:
        return
    if not 0 <= ratio < 1:
        raise ConfigError(f"warmup_ratio={ratio!r} in {WHERE} must be in [0, 1): a ratio of the total steps. For a "
                          "number of warm-up steps use warmup_steps=N.")
    if args.warmup_steps not in (0, ratio):
        raise ConfigError(f"{WHERE}: warmup_ratio={ratio!r} and warmup_steps={args.warmup_steps!r} name one setting "
                          "with two values; set only warmup_steps (a float below 1 is a ratio of the total steps).")
    args.warmup_steps = ratio
    notice(f"warmup_ratio={ratio!r} in {WHERE} is {OLDER_RELEASE}'s name: trainkit reads it as warmup_steps={ratio!r} "
           "(a value below 1 is a ratio of the total steps), the spelling of later releases.")


def _apply_group_by_length(args: Any, notice: Any) -> None:
    strategy = getattr(args.train_sampling_strategy, "value", args.train_sampling_strategy)
    if not args.group_by_length:
        args.group_by_length = strategy == "group_by_length"  # both spellings read alike, as in transformers 5.1
        return
    if strategy not in (DEFAULT_SAMPLING, "group_by_length"):
        raise ConfigError(f"{WHERE}: group_by_length=True and train_sampling_strategy={strategy!r} name one setting "
                          "with two values; set only train_sampling_strategy (group_by_length=True is "
                          "train_sampling_strategy='group_by_length').")
    args.train_sampling_strategy = "group_by_length"
    notice(f"group_by_length=True in {WHERE} is {OLDER_RELEASE}'s name: trainkit reads it as "
           "train_sampling_strategy='group_by_length', the spelling of later releases.")


def _apply_logging_dir(args: Any, notice: Any) -> None:
    if args.logging_dir is None:
        return
    args.logging_dir = os.path.expanduser(str(args.logging_dir))
    notice(f"logging_dir={args.logging_dir!r} in {WHERE} is {OLDER_RELEASE}'s name for the TensorBoard folder: "
           "trainkit writes the TensorBoard event files there when report_to includes 'tensorboard' (the other "
           "trackers write under output_dir).")
