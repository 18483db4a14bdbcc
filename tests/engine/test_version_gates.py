"""Version gates written for Accelerate, run on trainkit (CPU, one process).

Scripts decide by ``accelerate.__version__`` (after ``import trainkit as accelerate``) or by
``compare_versions("accelerate", ...)`` whether a feature exists. trainkit's ``__version__`` compares as the
Accelerate release whose API it implements (its own release rides in the local label), so a feature trainkit has
is never skipped by such a gate. The last test runs a training script in the style of diffusers' (EMA weights saved
and restored by ``register_save_state_pre_hook``/``register_load_state_pre_hook``, registered only behind a version
gate) with Accelerate itself (when installed) and with trainkit: both checkpoints carry the EMA weights.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
import torch
from packaging import version

import trainkit
from trainkit.utils import compare_versions

# Accelerate releases that introduced APIs trainkit implements, as scripts gate on them (0.16: state hooks,
# 0.20: project configuration, 1.0: the 1.x API); and one trainkit does not claim.
REACHED = ["0.16.0", "0.20.0", "0.28.0", "1.0.0", trainkit.__accelerate_version__]
NOT_REACHED = "99.0.0"


def test_version_is_the_accelerate_api_level_with_trainkit_release_as_local_label():
    parsed = version.parse(trainkit.__version__)
    assert parsed.public == trainkit.__accelerate_version__
    assert parsed.local == f"trainkit.{trainkit.__trainkit_version__}".lower()
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)  # tomllib is 3.11+; 3.10 is declared
    assert declared is not None and trainkit.__trainkit_version__ == declared.group(1)


def test_declared_api_level_is_the_accelerate_the_signatures_are_checked_against():
    accelerate = pytest.importorskip("accelerate", reason="accelerate (the oracle) is not installed")
    assert version.parse(accelerate.__version__).release[:2] == \
        version.parse(trainkit.__accelerate_version__).release[:2], (
            "The installed Accelerate moved: check the signatures against it, then update __accelerate_version__.")


@pytest.mark.parametrize("threshold", REACHED)
def test_gates_on_releases_trainkit_implements_open(threshold):
    assert version.parse(trainkit.__version__) >= version.parse(threshold)
    assert compare_versions("accelerate", ">=", threshold)
    assert not compare_versions("accelerate", "<", threshold)


def test_gates_beyond_the_implemented_release_stay_closed():
    assert version.parse(trainkit.__version__) < version.parse(NOT_REACHED)
    assert compare_versions("accelerate", "<", NOT_REACHED)


def test_compare_versions_answers_for_accelerate_without_the_package(monkeypatch):
    real = importlib.metadata.version

    def without_accelerate(name: str) -> str:
        if name == "accelerate":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", without_accelerate)
    assert compare_versions("accelerate", "==", trainkit.__accelerate_version__)
    assert compare_versions("torch", ">=", "2.0")  # other libraries: their installed version, as before
    with pytest.raises(ValueError, match="operation"):
        compare_versions("accelerate", "~=", "1.0")


class _EMA:
    """An exponential moving average of a model's weights, saved to and loaded from a folder of its own."""

    def __init__(self, model: torch.nn.Module, decay: float = 0.5) -> None:
        self.decay = decay
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def update(self, model: torch.nn.Module) -> None:
        for key, value in model.state_dict().items():
            self.weights[key].mul_(self.decay).add_(value.detach(), alpha=1 - self.decay)

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.weights, str(folder / "ema.safetensors"))

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.weights = load_file(str(folder / "ema.safetensors"))


def _train_with_gated_hooks(library: str, output: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A diffusers-style loop: hooks registered only when ``accelerate.__version__ >= 0.16.0``; returns the EMA
    weights in memory after training and those a fresh EMA reads back through ``load_state``."""
    accelerate = importlib.import_module(library)  # the script's `import accelerate` / `import trainkit as accelerate`
    accelerator = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    ema = _EMA(accelerator.unwrap_model(model))

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            ema.save(Path(output_dir) / "model_ema")

    def load_model_hook(models, input_dir):
        ema.load(Path(input_dir) / "model_ema")

    if version.parse(accelerate.__version__) >= version.parse("0.16.0"):
        accelerator.register_save_state_pre_hook(save_model_hook)
        accelerator.register_load_state_pre_hook(load_model_hook)
    for _ in range(3):
        loss = model(torch.ones(4, 3)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ema.update(accelerator.unwrap_model(model))
    accelerator.save_state(str(output))
    trained = {k: v.clone() for k, v in ema.weights.items()}
    ema.weights = {k: torch.zeros_like(v) for k, v in trained.items()}
    accelerator.load_state(str(output))
    accelerator.end_training()
    return trained, ema.weights


@pytest.mark.parametrize("library", ["accelerate", "trainkit"])
def test_checkpoints_of_a_version_gated_script_carry_the_ema_weights(library, tmp_path):
    if library == "accelerate":
        pytest.importorskip("accelerate", reason="accelerate (the oracle) is not installed")
    trained, restored = _train_with_gated_hooks(library, tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint" / "model_ema" / "ema.safetensors").is_file()
    assert trained.keys() == restored.keys()
    for key in trained:
        torch.testing.assert_close(restored[key], trained[key], rtol=0, atol=0)
    assert any(not torch.equal(trained[k], torch.zeros_like(trained[k])) for k in trained)
