"""Test-wide settings: offline hub, one thread per process (the machine has two cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tests.distributed import TRACKER_ENV  # noqa: E402 - W&B offline, MLflow local, for in-process tests too

for _key, _value in TRACKER_ENV.items():
    os.environ.setdefault(_key, _value)

import pytest


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where CUDA is absent, saying why (never silently)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
