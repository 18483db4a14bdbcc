"""Test-wide settings: offline hub, one thread per process (the machine has two cores), and the device.

Device rule: a test runs on CPU unless it is marked ``gpu``, and so do module-scoped fixtures. Tests that build an ``Accelerator`` or a
``Trainer`` in the pytest process get a fresh CPU process state (and it is torn down after them), so
nothing leaks from one test into the next and results do not depend on the machine having a GPU;
multi-process tests hide the GPUs from their workers (``tests.distributed.worker_env``).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tests.distributed import TRACKER_ENV  # noqa: E402 - W&B offline, MLflow local, for in-process tests too

for _key, _value in TRACKER_ENV.items():
    os.environ.setdefault(_key, _value)

import pytest


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test ends with the environment it started with.

    Library code sets process-wide switches (transformers' FSDP loading flags, for one); a test that
    triggers them would otherwise hand them to every later test and to the workers those launch.
    """
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="module", autouse=True)
def _cpu_process_state_for_module_fixtures():
    """Module-scoped fixtures (a shared reference run) are set up before the per-test state below: give them
    a CPU process state too, or on a GPU machine the engine would pick CUDA for them while the tests run on CPU."""
    from trainkit.engine.process.state import ProcessState

    ProcessState.reset()
    ProcessState.get(cpu=True)
    yield
    ProcessState.reset()


@pytest.fixture(autouse=True)
def _fresh_process_state(request):
    """Each test starts without process state: on CPU, or (``gpu`` tests) on the device the engine picks."""
    from trainkit.engine.process.state import ProcessState

    ProcessState.reset()
    if request.node.get_closest_marker("gpu") is None:
        ProcessState.get(cpu=True)
    yield
    ProcessState.reset()


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where CUDA is absent, saying why (never silently)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a folder that happens to be named gpu
            item.add_marker(skip)
