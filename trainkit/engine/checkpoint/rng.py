"""The random number generators' states (python, numpy, torch CPU, every CUDA device) as JSON.

Exact resume needs the next dropout mask, the next ``random.random()`` and the next numpy draw to be
the ones the uninterrupted run would have drawn. torch's states are ByteTensors: stored as base64.

What a training step draws from, and where each stream is kept:

- dropout and other random ops on the CPU: torch's CPU generator (saved here);
- the same ops on a GPU: that device's CUDA generator, one per device (saved here, every device);
- python's ``random`` and numpy's global generator (user code, augmentations; saved here);
- the data order and the DataLoader's per-epoch base seed (hence worker seeds): not global streams at all. The
  engine's loaders draw them from private generators reseeded from (seed, epoch), and the checkpoint keeps the
  seed and the position (``dataloaders.json``), so they continue exactly without being saved here.

CUDA's generators are set lazily by torch: a state set before CUDA is initialised is queued, and at
initialisation torch runs queued *seeds* after queued states, so a ``set_seed`` made earlier (the Trainer seeds
when it is created) would silently replace a restored state. Restoring therefore initialises CUDA first whenever
the run uses it, and checks that every device holds the restored state.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from trainkit.utils.random import rng_state_from_text, rng_state_to_text

logger = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states, JSON-serialisable.

    CUDA states are captured for every device once CUDA is initialised. Before that, no CUDA work has run in
    this process, so its generators hold nothing but the seed the script set, which the resumed run sets again;
    reading them would create a CUDA context in a process that may never use the GPU.
    """
    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=True)
    if not isinstance(legacy, tuple):  # numpy's stub allows the dict form; legacy=True returns the tuple
        raise TypeError(f"numpy returned {type(legacy).__name__} for its legacy RNG state")
    kind, keys, position, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "position": int(position), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": rng_state_to_text(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [rng_state_to_text(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Put every generator back where :func:`capture_rng_state` found it.

    ``device``: the device the run computes on. When it is a CUDA device (or CUDA is already initialised) the
    checkpoint's CUDA states are restored on every device, after initialising CUDA so that no queued seed can
    replace them later (see the module doc).
    """
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], np.asarray(numpy_state["keys"], dtype=np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(rng_state_from_text(state["torch"]))
    cuda = state.get("cuda")
    if cuda:
        _restore_cuda_states(cuda, device)


def _restore_cuda_states(texts: list[str], device: torch.device | None) -> None:
    uses_cuda = device is not None and torch.device(device).type == "cuda"
    if not torch.cuda.is_available():
        if uses_cuda:  # pragma: no cover - a CUDA device without CUDA cannot be prepared
            raise RuntimeError("The run computes on CUDA but CUDA is not available: the checkpoint's CUDA random "
                               "states cannot be restored.")
        logger.info("The checkpoint holds CUDA random states; this run has no CUDA, so only the CPU streams continue.")
        return
    if not (uses_cuda or torch.cuda.is_initialized()):
        return  # a CPU run in a process that never touched CUDA: nothing draws from those generators
    torch.cuda.init()  # run any queued seed now, before the states are set, never after
    count = torch.cuda.device_count()
    if len(texts) != count:
        logger.warning("The checkpoint holds CUDA RNG states for %d devices, this machine has %d; "
                       "restoring the ones that exist.", len(texts), count)
    for index, text in enumerate(texts[:count]):
        saved = rng_state_from_text(text)
        torch.cuda.set_rng_state(saved, index)
        now = torch.cuda.get_rng_state(index)
        if now.numel() == saved.numel() and not torch.equal(now, saved):
            raise RuntimeError(f"CUDA device {index} did not take the checkpoint's random state: the resumed run "
                               "would draw different dropout masks from the uninterrupted one.")
