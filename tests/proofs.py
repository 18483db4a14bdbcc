"""Proofs that a setting acts, shared by the TrainingArguments field proofs (tests/trainer/test_field_effects.py),
the Accelerator keyword proofs (tests/engine/test_accelerator_keyword_effects.py) and the check that each proof
fails when trainkit ignores its setting (tests/ignore_each_field.py).

A proof is one of:
- a function: it sets a non-default value and observes the effect from outside the code under test (what the
  model saw, files, log lines, numbers torch computed, calls torch or a client received); its parameters are
  pytest fixtures (``tmp_path``, ``monkeypatch``, ``caplog``, ``capfd``);
- :class:`Warns`: the setting cannot change anything in this run; building it logs one line naming it and why
  (once per process where ``once``);
- :class:`Refuses`: the setting needs something absent (a package, hardware, an integration); building it fails,
  naming what it needs;
- :class:`OnGPU`: the effect exists only where a CUDA device is; ``proof`` runs there (a ``gpu`` case), and
  ``here`` is what a CPU machine shows instead (a refusal or a notice), or None: skipped here with ``reason``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch


class Warns(NamedTuple):
    kwargs: dict[str, Any]
    text: str
    once: bool = True  # built twice in one process, the line appears once


class Refuses(NamedTuple):
    kwargs: dict[str, Any]
    text: str


class OnGPU(NamedTuple):
    proof: Callable[..., None]
    reason: str
    here: Any = None


def case(name: str, proof: Any, *marks: Any) -> Any:
    """One pytest case for ``name``: marked ``gpu`` where its proof needs the CUDA device this machine has."""
    on_gpu = isinstance(proof, OnGPU) and torch.cuda.is_available()
    return pytest.param(name, proof, id=name, marks=[*marks, *([pytest.mark.gpu] if on_gpu else [])])


def call(proof: Callable[..., None], request: pytest.FixtureRequest) -> None:
    """Run a proof function with the fixtures its parameters name."""
    proof(**{name: request.getfixturevalue(name) for name in inspect.signature(proof).parameters})


def run_proof(proof: Any, request: pytest.FixtureRequest, build: Callable[..., Any],
              forget_warnings: Callable[[], None] = lambda: None) -> None:
    """Run ``proof``; ``build(**kwargs)`` makes the object a Warns/Refuses proof constructs (``forget_warnings``
    clears the once-per-process memory of notices first)."""
    if isinstance(proof, OnGPU):
        if torch.cuda.is_available():
            return call(proof.proof, request)
        if proof.here is None:
            pytest.skip(proof.reason)
        proof = proof.here
    if isinstance(proof, Warns):
        caplog = request.getfixturevalue("caplog")
        forget_warnings()
        with caplog.at_level(logging.WARNING, logger="trainkit"):
            build(**proof.kwargs)
            build(**proof.kwargs)
        lines = [r.getMessage() for r in caplog.records if proof.text in r.getMessage()]
        assert len(lines) == (1 if proof.once else 2), lines
    elif isinstance(proof, Refuses):
        with pytest.raises((ValueError, TypeError, NotImplementedError), match=proof.text):
            build(**proof.kwargs)
    else:
        call(proof, request)
    return None
