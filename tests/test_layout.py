"""The engine's folders, one per concept, and who may import the engine (CPU only, no processes; reads the source).

``tests/test_architecture.py`` checks the layers and cycles; this file checks the map of ``docs/architecture.md``:
the top of ``engine/`` holds only the facade, every engine folder is a named concept, a concept that grows
(precision, strategies, trackers, checkpoint storage) has a contract module beside its registry, and the
Accelerate-path shims are the one documented exception that may import the engine from outside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "trainkit"
ENGINE = PACKAGE_ROOT / "engine"

ENGINE_FOLDERS = {
    "accelerator_parts": "the Accelerate API pieces the facade is made of (identity, trackers, prepared objects, options)",
    "process": "process state, devices, collectives, control, launchers, preemption",
    "precision": "mixed precision: the Precision contract, its implementations, the mode registry",
    "strategies": "parallelism strategies, their contract and registry; fsdp/ holds everything FSDP",
    "step": "one optimizer step: accumulation, optimizer/scheduler wrappers, compile, unwrapping",
    "data": "dataloaders: sharding, resumable positions, streams",
    "checkpoint": "save_state/load_state: atomic folders, storage, model and optimizer state, RNG",
    "tracking": "experiment trackers: the GeneralTracker contract, one file per tracker, the registry",
    "deepspeed": "DeepSpeed configs on torch: placeholders, the optimizer and schedule a config names, ZeRO-1",
    "parallel": "N-D parallelism: the degrees' device mesh (ParallelDims), tensor-parallel plans, pretrained sharding",
    "inference": "big-model inference: module hooks, device alignment and weight offload, the offload format, dispatch",
    # ... and device-map planning (sizes, budgets, infer_auto_device_map) and loading checkpoints along a map
}
"""Every sub-folder of ``trainkit/engine`` and what it holds (docs/architecture.md has the same map)."""

SEAMS = {
    "precision": ("base.py", "registry.py"),
    "strategies": ("base.py", "registry.py"),
    "tracking": ("base.py", "registry.py"),
    "checkpoint/storage": ("base.py", "registry.py"),
}
"""Concepts that grow: a contract and a registry, so that a new implementation is one file and one entry."""

ACCELERATE_PATH_SHIMS = {"trainkit", "trainkit.accelerator", "trainkit.big_modeling", "trainkit.data_loader", "trainkit.hooks",
                         "trainkit.local_sgd", "trainkit.logging", "trainkit.optimizer", "trainkit.scheduler", "trainkit.state", "trainkit.tracking"}
"""Top-level modules that exist because Accelerate scripts import them by these paths; with ``trainkit.utils``
they re-export engine objects, so they (and the layers above the engine) are the only importers of the engine."""


def _engine_importers() -> set[str]:
    importers = set()
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "trainkit.engine" or name.startswith("trainkit.engine.") for name in names):
                importers.add(module)
    return importers


def test_the_top_of_engine_holds_only_the_facade() -> None:
    loose = sorted(path.name for path in ENGINE.glob("*.py"))
    assert loose == ["__init__.py", "accelerator.py"]


def test_every_engine_folder_is_a_named_concept_with_a_docstring() -> None:
    folders = sorted(path.name for path in ENGINE.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert folders == sorted(ENGINE_FOLDERS)
    for folder in folders:
        init = ENGINE / folder / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), folder


def test_growing_concepts_have_a_contract_and_a_registry() -> None:
    for folder, files in SEAMS.items():
        for name in files:
            assert (ENGINE / folder / name).exists(), f"engine/{folder}/{name}"


def test_only_the_layers_above_and_the_accelerate_path_shims_import_the_engine() -> None:
    allowed_prefixes = ("trainkit.engine", "trainkit.trainer", "trainkit.cli", "trainkit.utils")
    outside = sorted(module for module in _engine_importers()
                     if not module.startswith(allowed_prefixes) and module not in ACCELERATE_PATH_SHIMS)
    assert outside == []
