"""The checkpointing section, declared once: the project settings of ``ProjectConfiguration`` that decide how
checkpoints are named, kept and written.

``ProjectConfiguration`` (``trainkit.utils.dataclasses``, Accelerate's ``project_config``) declares its fields
with these :class:`~trainkit.config.options.Option` objects and parses them once, when it is built;
``TrainingArguments`` parses the fields it shares (each option's ``training_arguments`` keyword names the field,
:func:`training_arguments_fields`) once, in its checks, and the Trainer hands them over already parsed
(``ProjectConfiguration.from_parsed``). The engine's checkpointer and background writer read the parsed values
and check nothing again. No torch here.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .options import Keyword, Option

ASYNC_SAVE_WHEN_BUSY_CHOICES = ("wait", "skip")
"""What an asynchronous save does when the previous one is still being written: wait for it, or be skipped."""


def parse_async_save(value: Any, key: str, where: str) -> bool:
    """``True`` or ``False`` exactly (a Python surface: no spellings to read)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{where}({key}={value!r}): use True or False.")
    return value


def parse_async_save_when_busy(value: Any, key: str, where: str) -> str:
    """``"wait"`` or ``"skip"``, refused with what each means."""
    if value not in ASYNC_SAVE_WHEN_BUSY_CHOICES:
        raise ConfigError(f"{key}={value!r} in {where} is not valid; use 'wait' (a save waits for the one being "
                          "written: no checkpoint is lost) or 'skip' (it is skipped while one is written).")
    return value


AUTOMATIC_CHECKPOINT_NAMING = Option(
    help="save_state() without a folder writes <project_dir>/checkpoints/checkpoint_<i>; load_state() resumes the "
         "latest.", default=False, flag=False)
TOTAL_LIMIT = Option(
    help="With automatic_checkpoint_naming: keep at most this many checkpoints (None or 0: all).", flag=False)
SAVE_ON_EACH_NODE = Option(
    help="Write checkpoints on each machine's first process (for machines without a shared disk).", default=False,
    flag=False, training_arguments=(Keyword("save_on_each_node"),))
ASYNC_SAVE = Option(
    help="trainkit: save_state returns once the state is copied to host memory; a background thread writes, "
         "checksums and commits it atomically (docs/checkpoints.md, \"Asynchronous saves\").",
    default=False, parse=parse_async_save, flag=False, training_arguments=(Keyword("async_save"),))
ASYNC_SAVE_WHEN_BUSY = Option(
    help="trainkit, with async_save: a save that finds the previous one still being written waits for it "
         "('wait', the default: no checkpoint is lost) or is skipped on every process with a warning ('skip').",
    default="wait", choices=ASYNC_SAVE_WHEN_BUSY_CHOICES, parse=parse_async_save_when_busy, flag=False,
    training_arguments=(Keyword("async_save_when_busy"),))

CHECKPOINTING: dict[str, Option] = {
    "automatic_checkpoint_naming": AUTOMATIC_CHECKPOINT_NAMING, "total_limit": TOTAL_LIMIT,
    "save_on_each_node": SAVE_ON_EACH_NODE, "async_save": ASYNC_SAVE, "async_save_when_busy": ASYNC_SAVE_WHEN_BUSY}
"""The section: ``ProjectConfiguration`` field -> its option (the class declares its fields with these)."""


def training_arguments_fields() -> dict[str, tuple[str, Option]]:
    """``TrainingArguments`` field -> (the ``ProjectConfiguration`` field it sets, its option)."""
    return {keyword.name: (name, option) for name, option in CHECKPOINTING.items()
            for keyword in option.training_arguments}
