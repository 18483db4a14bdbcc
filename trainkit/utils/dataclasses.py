"""Small configuration objects that Accelerate scripts import and pass to ``Accelerator(...)``."""

from __future__ import annotations

import dataclasses
import enum
from datetime import timedelta
from typing import Any


class DistributedType(str, enum.Enum):
    """How the processes of a run cooperate (names and values as in Accelerate)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    FSDP = "FSDP"


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How ``Accelerator.prepare`` shards dataloaders across processes.

    split_batches: each yielded batch is the *global* batch and is split across processes (batch size
        must be a multiple of the number of processes); otherwise each process gets whole batches.
    even_batches: pad the last global batch with samples from the start of the epoch so every process
        gets batches of the same size (``gather_for_metrics`` drops the padding again).
    use_seedable_sampler: accepted for compatibility; trainkit always replaces a ``RandomSampler`` by a
        seeded one (same order on every rank, resumable) — see docs/engine.md.
    non_blocking: copy batches to the device with ``non_blocking=True``.
    data_seed: seed of the shuffling order; default: drawn from torch's RNG (so ``set_seed`` fixes it).
    use_stateful_dataloader: ``load_state`` also restores each prepared loader's position inside its
        epoch (exact and reshardable; see docs/checkpoints.md). False (Accelerate's default): ``load_state``
        restores the epoch only and the script calls ``skip_first_batches`` for the batches already seen.
    """

    split_batches: bool = False
    even_batches: bool = True
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    data_seed: int | None = None
    use_stateful_dataloader: bool = False


class KwargsHandler:
    """Base of the ``kwargs_handlers`` objects: non-default fields become keyword arguments."""

    def to_kwargs(self) -> dict[str, Any]:
        """Return the fields whose values differ from the defaults."""
        default = self.__class__()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Keyword arguments passed on to ``torch.nn.parallel.DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Keyword arguments passed on to ``torch.amp.GradScaler`` under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Keyword arguments for ``torch.distributed.init_process_group`` (backend and timeout)."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclasses.dataclass
class ProjectConfiguration:
    """Where trackers and automatically named checkpoints go (Accelerate's ``project_config``)."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set ``project_dir`` and default ``logging_dir`` to it."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir
