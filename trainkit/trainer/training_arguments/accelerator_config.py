"""``TrainingArguments.accelerator_config``: the engine's data and accumulation options, as one small dataclass.

transformers holds this field as ``transformers.trainer_pt_utils.AcceleratorConfig``. trainkit holds its own
class with the same fields, defaults and methods (``to_dict``, ``pop``, ``from_json_file``), so that building the
arguments of a plain ``nn.Module`` run does not import transformers (~0.3 s of start-up: its package scans the
model folders). ``tests/trainer/test_built_here.py`` compares the fields, defaults and methods with the installed
transformers' class, so a release that adds a key shows up there, not in a user's run.

Loading (a dict, a JSON string or file, transformers' own instance) and checking the values is
``checks._load_accelerator_config`` (at construction).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from trainkit.config.errors import ConfigError


@dataclass
class AcceleratorConfig:
    """How the Trainer's engine splits, dispatches and seeds batches, and its accumulation options."""

    split_batches: bool = field(default=False, metadata={"help": "Split each loader batch across the processes (the batch size is global) instead of giving each process its own batch."})
    dispatch_batches: bool | None = field(default=None, metadata={"help": "The main process reads the batches and sends each process its share (None: only for iterable datasets)."})
    even_batches: bool = field(default=True, metadata={"help": "Repeat examples from the start so every process gets the same number of batches."})
    use_seedable_sampler: bool = field(default=True, metadata={"help": "Shuffle with a sampler seeded from the run's seed, so the order repeats across runs and resumes."})
    non_blocking: bool = field(default=False, metadata={"help": "Copy batches to the device asynchronously (useful with pinned memory)."})
    gradient_accumulation_kwargs: dict[str, Any] | None = field(default=None, metadata={"help": "Accumulation options: num_steps, sync_each_batch, adjust_scheduler, sync_with_dataloader."})
    use_configured_state: bool = field(default=False, metadata={"help": "Reuse the process state created before the Trainer (trainkit always does; True needs one to exist)."})

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str]) -> AcceleratorConfig:
        """Read a JSON object of these keys; an unknown key is refused, naming it and the known ones."""
        with open(json_file, encoding="utf-8") as handle:
            values = json.load(handle)
        unknown = sorted(set(values) - set(ACCELERATOR_CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"accelerator_config file {os.fspath(json_file)!r} has unknown keys {unknown}; "
                              f"the keys are {list(ACCELERATOR_CONFIG_KEYS)}.")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The keys and values, copied (changing the dict leaves the config alone)."""
        return copy.deepcopy(self.__dict__)

    def pop(self, key: str, default: Any = None) -> Any:
        """Remove ``key`` from the instance and return its value (``default`` when it is not set on it)."""
        return self.__dict__.pop(key, default)


ACCELERATOR_CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(AcceleratorConfig))
"""Every accelerator_config key."""
ACCUMULATION_KEYS = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")
"""accelerator_config["gradient_accumulation_kwargs"] keys: the engine's GradientAccumulationPlugin fields."""
