"""transformers' own ``TrainingArguments``, the oracle of trainkit's, constructible on every declared stack.

transformers discovers the device while constructing its arguments, and needs Accelerate for that; two of the
declared stacks have no Accelerate (as users install trainkit). The oracle is transformers' class with that one
discovery answered "CPU, no GPU": every field, default, check and serialisation is transformers' own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import transformers


class CPUTrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments on a CPU-only machine, without Accelerate's device discovery."""

    @functools.cached_property
    def _setup_devices(self) -> torch.device:
        self._n_gpu = 0
        return torch.device("cpu")


def transformers_arguments(argv: list[str] | None = None, **kwargs: Any) -> transformers.TrainingArguments:
    """transformers' arguments from a command line (through its HfArgumentParser) or from keywords."""
    if argv is None:
        return CPUTrainingArguments(**kwargs)
    (parsed,) = transformers.HfArgumentParser(CPUTrainingArguments).parse_args_into_dataclasses(argv)
    return parsed
