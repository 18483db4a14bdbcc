"""The precision seam: one registry from mode to class, and the hooks the Accelerator calls (CPU only)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainkit import Accelerator
from trainkit.config.precision import MIXED_PRECISIONS
from trainkit.engine.precision import registry
from trainkit.engine.precision.amp import AutocastPrecision
from trainkit.engine.precision.base import Precision


def test_registry_covers_the_launch_vocabulary_and_builds_each_mode_on_cpu():
    assert registry.PRECISIONS == MIXED_PRECISIONS
    for mode in registry.PRECISIONS:
        precision = registry.build_precision(mode, torch.device("cpu"))
        assert isinstance(precision, Precision) and precision.mode == mode
        assert precision.enabled == (mode != "no")
        assert (precision.scaler is not None) == (mode == "fp16")


def test_unknown_mode_is_refused_by_name_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"'bf61'.*bf16"):
        registry.build_precision("bf61", torch.device("cpu"))


class RecordingPrecision(AutocastPrecision):
    """bf16 that writes down which hook ran, in order."""

    calls: list[str] = []

    def convert_module(self, module: nn.Module) -> nn.Module:
        self.calls.append("convert_module")
        module.converted_by_precision = True
        return module

    def wrap_forward(self, forward):
        self.calls.append("wrap_forward")
        return super().wrap_forward(forward)

    def backward(self, loss, **kwargs):
        self.calls.append("backward")
        super().backward(loss, **kwargs)

    def optimizer_step(self, optimizer, **kwargs):
        self.calls.append("optimizer_step")
        return super().optimizer_step(optimizer, **kwargs)

    def state_dict(self):
        self.calls.append("state_dict")
        return {"recorded": len(self.calls)}


def test_a_registered_precision_gets_every_hook_in_order(monkeypatch, tmp_path):
    target = f"{__name__}:RecordingPrecision"
    monkeypatch.setitem(registry.PRECISION_REGISTRY, "bf16", registry.PrecisionEntry(target))
    RecordingPrecision.calls = []
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", project_dir=str(tmp_path))
    assert isinstance(accelerator.precision, RecordingPrecision)
    model = nn.Linear(4, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator.unwrap_model(model).converted_by_precision
    loss = model(torch.randn(3, 4)).sum()
    assert loss.dtype == torch.float32  # the forward ran under the precision's wrapper
    accelerator.backward(loss)
    optimizer.step()
    accelerator.save_state(str(tmp_path / "state"))
    assert RecordingPrecision.calls[:4] == ["convert_module", "wrap_forward", "backward", "optimizer_step"]
    assert "state_dict" in RecordingPrecision.calls
