"""glibc allocator tuning: applied once per process, skippable, and it really removes per-step page faults.

Each check runs a probe in a fresh Python process (CPU): the tuning applies once per process, at the engine's start.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys, torch
from torch import nn
from trainkit.engine.process.allocator import tune_allocator
applied = tune_allocator()
if sys.argv[1] == "0":  # whether the tuning applied is all that is asked: no training to measure
    print(json.dumps({"applied": applied}))
    raise SystemExit
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,))
def steps(n):  # what training does: allocate and free activations and gradients every step
    for _ in range(n):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
steps(3)  # warm-up
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
steps(20)
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(measure: bool = True, **env: str) -> dict:
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "TRAINKIT_ALLOCATOR"))}
    environment.update(env)
    result = subprocess.run([sys.executable, "-c", PROBE, "1" if measure else "0"], capture_output=True, text=True,
                            env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two probes of 23 training steps, one of them paying ~9,000 page faults a step (10-50 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_tuning_removes_page_faults_of_reallocated_buffers():
    tuned, untuned = _probe(), _probe(TRAINKIT_ALLOCATOR_TUNING="0")
    assert tuned["applied"] and not untuned["applied"]
    assert tuned["faults"] * 10 < untuned["faults"], (tuned, untuned)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_explicit_malloc_settings_are_left_alone():
    assert not _probe(measure=False, MALLOC_MMAP_THRESHOLD_="131072")["applied"]
