"""Accelerate's public API, compared name by name with the installed Accelerate (CPU only, one process).

The names come from Accelerate itself at test time, never from a list typed here: for each module path
trainkit mirrors, a package's public names are what its ``__init__`` defines or imports from Accelerate,
a plain module's are what it defines (its helper imports are not its API). Third-party objects, loggers
and typing aliases are left out. For each name, trainkit's module of the same path must have it, and:

- a function or class has the same parameters (names, kinds, order, defaults); trainkit may add
  keyword-only parameters with defaults, which no Accelerate call can reach by accident;
- a class named in :data:`CLASSES_WITH_METHODS` (the Accelerator, the states, the prepared wrappers)
  has every public method and property of Accelerate's, methods with the same parameters;
- a constant has the same value;
- a name trainkit does not drive (hardware, Megatron-LM, big-model inference...) is listed in
  ``trainkit.utils.unsupported.NOT_DRIVEN`` and, when called, raises ``NotImplementedError`` saying why.

:data:`ALLOWED_DIFFERENCES` holds the deliberate differences, each with its reason; docs/migrating-from-accelerate.md
lists them for users. :data:`NOT_YET_MIRRORED` lists what is still missing as strict expected failures (run with
``TRAINKIT_SHOW_PENDING=1`` to see them fail with their reasons). A decorator that hides Accelerate's parameters
behind ``(*args, **kwargs)`` leaves nothing to compare. Accelerate is a test-only dependency: trainkit never
imports it.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import logging
import os
import types
from typing import Any

import pytest

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed: the signature test compares "
                                                      "trainkit with the installed Accelerate (pip install -e .[test])")

MODULES = [
    "accelerate", "accelerate.utils", "accelerate.state", "accelerate.data_loader", "accelerate.logging",
    "accelerate.tracking", "accelerate.local_sgd", "accelerate.utils.dataclasses", "accelerate.utils.operations",
    "accelerate.utils.constants", "accelerate.utils.random", "accelerate.optimizer", "accelerate.scheduler",
]
CLASSES_WITH_METHODS = [
    "accelerate.Accelerator", "accelerate.state.PartialState", "accelerate.state.AcceleratorState",
    "accelerate.state.GradientState", "accelerate.optimizer.AcceleratedOptimizer",
    "accelerate.scheduler.AcceleratedScheduler", "accelerate.data_loader.DataLoaderShard",
]

# Deliberate differences: "accelerate.path.Name", "accelerate.path.Class.method", or a bare "Name" (at every
# path that exports it) -> why trainkit differs on purpose. docs/migrating-from-accelerate.md lists them too.
ALLOWED_DIFFERENCES: dict[str, str] = {
    "accelerate.Accelerator(gradient_accumulation_steps)": "None means \"not set\", so the launcher's value applies "
                                                          "and an explicit 1 still overrides it (Accelerate: 1)",
    "accelerate.Accelerator(cpu)": "None means \"not set\", so `trainkit launch --cpu` applies and an explicit False "
                                   "still overrides it (Accelerate: False)",
    "accelerate.tracking.LOGGER_TYPE_TO_CLASS": "maps the same names to trainkit's tracker classes, for the trackers "
                                                "trainkit has built in (others are registered by the script)",
    "accelerate.utils.dataclasses.MODEL_CONFIGS_TO_MEGATRON_PARSERS": "Megatron-LM is not driven by trainkit",
    "accelerate.notebook_launcher(use_port)": "None picks a free port, so two launches on one machine never collide "
                                              "(Accelerate: '29500')",
    "InitProcessGroupKwargs": "backend defaults to None: trainkit picks the backend from the device (gloo on CPU, "
                              "nccl on CUDA) instead of Accelerate's 'nccl'",
}

# Not mirrored yet (issue 23 follow-up): each fails today, so each is a strict xfail; mirroring one makes its
# test pass, and the strict xfail then fails until the entry is removed here. This list may only shrink.
NOT_YET_MIRRORED = frozenset("""
""".split())
PLAIN_DATA = (str, bytes, int, float, bool, type(None), tuple, list, dict, set, frozenset)


def _is_plain_data(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_is_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(_is_plain_data(k) and (_is_plain_data(v) or callable(v)) for k, v in value.items())
    return isinstance(value, PLAIN_DATA)


def _top_level_names(module: types.ModuleType) -> list[str]:
    """Names a module defines (def, class, assignment); a package also exports what it imports from Accelerate."""
    tree = ast.parse(inspect.getsource(module))
    is_package = module.__file__.endswith("__init__.py")
    names: list[str] = []
    for node in ast.walk(tree) if is_package else tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
        elif is_package and isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("accelerate")):
            names += [alias.asname or alias.name for alias in node.names]
    return list(dict.fromkeys(names))


def public_names(module_path: str) -> dict[str, Any]:
    """Accelerate's public API at ``module_path``: name -> object (functions, classes, plain-data constants)."""
    module = importlib.import_module(module_path)
    found = {}
    for name in _top_level_names(module):
        if name.startswith("_") or not hasattr(module, name):
            continue
        value = getattr(module, name)
        if isinstance(value, (types.ModuleType, logging.Logger, logging.LoggerAdapter)):
            continue
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value) or callable(value):
            if not (getattr(value, "__module__", "") or "").startswith("accelerate"):
                continue  # a third-party object that Accelerate merely uses (torch, typing, functools...)
            found[name] = value
        elif _is_plain_data(value):
            found[name] = value
    return found


def _trainkit_path(path: str) -> str:
    return "trainkit" + path[len("accelerate"):]


def _not_driven() -> dict[str, str]:
    from trainkit.utils.unsupported import NOT_DRIVEN

    return NOT_DRIVEN


def _same_default(theirs: Any, ours: Any) -> bool:
    if theirs is inspect.Parameter.empty or ours is inspect.Parameter.empty:
        return theirs is ours
    if type(theirs) is object:  # Accelerate's private "not set" sentinel; trainkit spells "not set" None
        return ours is None or type(ours) is object
    if callable(theirs) and not isinstance(theirs, enum.Enum):
        return callable(ours) and getattr(theirs, "__name__", None) == getattr(ours, "__name__", None)
    if isinstance(theirs, enum.Enum) or isinstance(ours, enum.Enum):
        return getattr(theirs, "value", theirs) == getattr(ours, "value", ours)
    try:
        return bool(theirs == ours) and type(theirs) is type(ours)
    except Exception:  # noqa: BLE001 - objects without a usable ==
        return type(theirs) is type(ours)


def signature_differences(theirs: Any, ours: Any, key: str = "") -> list[str]:
    """What a call written for ``theirs`` would find different in ``ours`` (empty when nothing).

    ``key`` names the callable for parameter-level allowances (``ALLOWED_DIFFERENCES["key(param)"]``)."""
    try:
        sig_theirs = inspect.signature(theirs)
    except (TypeError, ValueError):
        return []  # a builtin without a signature on Accelerate's side: nothing to compare
    kinds = [p.kind for p in sig_theirs.parameters.values() if p.name != "self"]
    if kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        return []  # a decorator hid Accelerate's parameters: there is nothing to compare against
    try:
        sig_ours = inspect.signature(ours)
    except (TypeError, ValueError):
        return ["trainkit's has no inspectable signature"]
    params_theirs = list(sig_theirs.parameters.values())
    params_ours = {p.name: p for p in sig_ours.parameters.values()}
    problems = []
    for index, param in enumerate(params_theirs):
        mine = params_ours.get(param.name)
        if mine is None:
            problems.append(f"missing parameter {param.name!r}")
            continue
        if mine.kind != param.kind:
            problems.append(f"{param.name!r} is {mine.kind.name}, Accelerate's is {param.kind.name}")
        if not _same_default(param.default, mine.default) and f"{key}({param.name})" not in ALLOWED_DIFFERENCES:
            problems.append(f"{param.name!r} defaults to {mine.default!r}, Accelerate's to {param.default!r}")
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            position = list(params_ours).index(param.name)
            if position != index:
                problems.append(f"{param.name!r} is positional parameter {position}, Accelerate's is {index}")
    for name, mine in params_ours.items():
        if name in sig_theirs.parameters:
            continue
        if mine.kind is mine.KEYWORD_ONLY and mine.default is not mine.empty:
            continue  # a trainkit extension no Accelerate call can reach
        if mine.kind is mine.VAR_KEYWORD and any(p.kind is p.VAR_KEYWORD for p in params_theirs):
            continue
        problems.append(f"extra parameter {name!r} ({mine.kind.name})")
    return problems


def _entries() -> list[tuple[str, str, Any]]:
    entries = []
    for module_path in MODULES:
        for name, value in public_names(module_path).items():
            entries.append((module_path, name, value))
    return entries


ENTRIES = _entries()
FUNCTIONS = [e for e in ENTRIES if callable(e[2])]
CONSTANTS = [e for e in ENTRIES if not callable(e[2])]
_SHOW_PENDING = bool(os.environ.get("TRAINKIT_SHOW_PENDING"))  # run the pending entries as plain tests, to work on them
_PENDING = pytest.mark.xfail(strict=True, reason="not mirrored yet (NOT_YET_MIRRORED, issue 23 follow-up)")


def _params(entries: list[tuple[str, str, Any]]) -> list[Any]:
    """One pytest param per entry, id "accelerate.path.Name"; entries of NOT_YET_MIRRORED are strict xfails."""
    return [pytest.param(*entry, id=f"{entry[0]}.{entry[1]}",
                         marks=[_PENDING] if f"{entry[0]}.{entry[1]}" in NOT_YET_MIRRORED and not _SHOW_PENDING else [])
            for entry in entries]


def _allowed(key: str) -> str | None:
    return ALLOWED_DIFFERENCES.get(key) or ALLOWED_DIFFERENCES.get(key.rpartition(".")[2])


def _resolve(path: str) -> Any:
    module_path, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_path), name)


def _trainkit_target(obj: Any) -> Any:
    """The class behind one of trainkit's state aliases (``PartialState()`` returns the shared process state)."""
    return getattr(obj, "target", obj)


def test_the_comparison_covers_accelerate(record_property):
    """Guards the enumeration itself: if it found nothing, every other test here would pass vacuously."""
    methods = sum(len(_public_members(_resolve(path))) for path in CLASSES_WITH_METHODS)
    record_property("callables", len(FUNCTIONS))
    record_property("constants", len(CONSTANTS))
    record_property("methods", methods)
    logging.getLogger(__name__).info("compared %d callables, %d constants, %d methods",
                                     len(FUNCTIONS), len(CONSTANTS), methods)
    assert len(FUNCTIONS) > 300 and len(CONSTANTS) > 40 and methods > 100


@pytest.mark.parametrize("module_path, name, theirs", _params(FUNCTIONS))
def test_callable_exists_with_accelerates_signature(module_path, name, theirs):
    key = f"{module_path}.{name}"
    if reason := _allowed(key):
        pytest.skip(reason)
    module = importlib.import_module(_trainkit_path(module_path))
    assert hasattr(module, name), f"{_trainkit_path(module_path)}.{name} is missing (Accelerate has {key})"
    ours = getattr(module, name)
    if name in _not_driven():
        return  # checked by test_not_driven_names_raise_saying_why
    assert callable(ours), f"{_trainkit_path(module_path)}.{name} is not callable"
    problems = signature_differences(theirs, ours, f"{module_path}.{name}")
    assert not problems, f"{_trainkit_path(module_path)}.{name}: " + "; ".join(problems)


@pytest.mark.parametrize("module_path, name, theirs", _params(CONSTANTS))
def test_constant_has_accelerates_value(module_path, name, theirs):
    key = f"{module_path}.{name}"
    if reason := _allowed(key):
        pytest.skip(reason)
    module = importlib.import_module(_trainkit_path(module_path))
    assert hasattr(module, name), f"{_trainkit_path(module_path)}.{name} is missing (Accelerate has {key})"
    assert getattr(module, name) == theirs


def _public_members(cls: type) -> dict[str, Any]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls)
            if not name.startswith("_") and name not in dir(object)}


METHODS = [(path, name, member) for path in CLASSES_WITH_METHODS
           for name, member in _public_members(_resolve(path)).items()]


@pytest.mark.parametrize("class_path, name, theirs", _params(METHODS))
def test_method_exists_with_accelerates_signature(class_path, name, theirs):
    key = f"{class_path}.{name}"
    if reason := ALLOWED_DIFFERENCES.get(key) or ALLOWED_DIFFERENCES.get(class_path):
        pytest.skip(reason)
    ours_cls = _trainkit_target(_resolve(_trainkit_path(class_path)))
    assert hasattr(ours_cls, name), f"{ours_cls.__name__}.{name} is missing (Accelerate has {key})"
    ours = inspect.getattr_static(ours_cls, name)
    if isinstance(theirs, (property, types.GetSetDescriptorType, types.MemberDescriptorType)) or not callable(
            getattr(_resolve(class_path), name)):
        return  # an attribute: its presence is the contract
    problems = signature_differences(getattr(_resolve(class_path), name), getattr(ours_cls, name), key)
    if isinstance(theirs, staticmethod) != isinstance(ours, staticmethod):
        problems.append("staticmethod on one side only")
    assert not problems, f"{ours_cls.__name__}.{name}: " + "; ".join(problems)


NOT_DRIVEN_ENTRIES = sorted({(m, n) for m, n, _ in FUNCTIONS if n in _not_driven()})


@pytest.mark.parametrize("module_path, name", NOT_DRIVEN_ENTRIES, ids=[f"{m}.{n}" for m, n in NOT_DRIVEN_ENTRIES])
def test_not_driven_names_raise_saying_why(module_path, name):
    reason = _not_driven()[name]
    ours = getattr(importlib.import_module(_trainkit_path(module_path)), name)
    with pytest.raises(NotImplementedError) as raised:
        ours()
    assert name in str(raised.value) and reason in str(raised.value)
