"""``Accelerator.profile()``: torch's profiler configured from :class:`ProfileKwargs`, one trace per process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from trainkit.utils.dataclasses import ProfileKwargs

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}


def _activities(names: list[str] | None, device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    if names is None:
        names = ["cpu"] + (["cuda"] if device.type == "cuda" else [])
    activities = []
    for name in names:
        key = str(getattr(name, "name", name)).lower()
        if key not in _ACTIVITIES or not hasattr(torch.profiler.ProfilerActivity, _ACTIVITIES[key]):
            raise ValueError(f"ProfileKwargs(activities=...) got {name!r}; valid: {sorted(_ACTIVITIES)}.")
        activities.append(getattr(torch.profiler.ProfilerActivity, _ACTIVITIES[key]))
    return activities


@contextlib.contextmanager
def profile(options: ProfileKwargs | None, device: torch.device, process_index: int) -> Iterator[torch.profiler.profile]:
    """Profile the block; with ``output_trace_dir`` each process writes ``trace_rank_<i>.json`` at the end."""
    options = options or ProfileKwargs()
    schedule = torch.profiler.schedule(**options.schedule_option) if options.schedule_option else None
    profiler = torch.profiler.profile(
        activities=_activities(options.activities, device),
        schedule=schedule,
        on_trace_ready=options.on_trace_ready,
        record_shapes=options.record_shapes,
        profile_memory=options.profile_memory,
        with_stack=options.with_stack,
        with_flops=options.with_flops,
        with_modules=options.with_modules,
    )
    with profiler:
        yield profiler
    if options.output_trace_dir:
        os.makedirs(options.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(options.output_trace_dir, f"trace_rank_{process_index}.json"))
