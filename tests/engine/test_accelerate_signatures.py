"""Accelerate's public API, compared name by name with the installed Accelerate (CPU only, one process).

The names come from Accelerate itself at test time, never from a list typed here: for each module path
trainkit mirrors, a package's public names are what its ``__init__`` defines or imports from Accelerate,
a plain module's are what it defines (its helper imports are not its API). Third-party objects, loggers
and typing aliases are left out. For each name, trainkit's module of the same path must have it, and:

- a function or class has the same parameters (names, kinds, order, defaults); trainkit may add
  keyword-only parameters with defaults, which no Accelerate call can reach by accident. Where a decorator
  hides Accelerate's parameters behind ``(*args, **kwargs)``, the parameters its source declares are used;
- a name trainkit does not drive (hardware, Megatron-LM, big-model inference...) is a placeholder listed in
  ``trainkit.utils.unsupported.NOT_DRIVEN``: it has Accelerate's parameters too, and raises
  ``NotImplementedError`` saying why when called;
- an enum has Accelerate's members (names and values), an exception class Accelerate's built-in bases;
- a class named in :data:`CLASSES_WITH_METHODS` (the Accelerator, the states, the prepared wrappers) has every
  public member of Accelerate's: methods with the same parameters, properties as properties (settable where
  Accelerate's are), class attributes with the same value;
- a constant has the same value.

:data:`ALLOWED_DIFFERENCES` holds the deliberate differences, one parameter (or constant) each, with its reason;
docs/migrating-from-accelerate.md lists them for users. Accelerate is a test-only dependency: trainkit never
imports it, and this module is skipped where it is not installed (the gpu-image and oldest stacks).
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import logging
import textwrap
import types
from typing import Any, NamedTuple

import pytest

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed: the signature test compares "
                                                      "trainkit with the installed Accelerate (pip install -e .[test])")

MODULES = [
    "accelerate", "accelerate.utils", "accelerate.state", "accelerate.data_loader", "accelerate.logging",
    "accelerate.tracking", "accelerate.local_sgd", "accelerate.utils.dataclasses", "accelerate.utils.operations",
    "accelerate.utils.constants", "accelerate.utils.random", "accelerate.optimizer", "accelerate.scheduler",
    "accelerate.hooks", "accelerate.big_modeling", "accelerate.utils.offload",
    "accelerate.utils.modeling",
]
CLASSES_WITH_METHODS = [
    "accelerate.Accelerator", "accelerate.state.PartialState", "accelerate.state.AcceleratorState",
    "accelerate.state.GradientState", "accelerate.optimizer.AcceleratedOptimizer",
    "accelerate.scheduler.AcceleratedScheduler", "accelerate.data_loader.DataLoaderShard",
]

# Deliberate differences, one each: "accelerate.path.Name(parameter)" (a callable's parameter at that path),
# "Name(parameter)" (at every path exporting Name), "accelerate.path.Class.method(parameter)", or
# "accelerate.path.CONSTANT" (a constant's value) -> why trainkit differs. docs/migrating-from-accelerate.md lists them.
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
    "InitProcessGroupKwargs(backend)": "None: trainkit picks the backend from the device (gloo on CPU, nccl on CUDA) "
                                       "instead of Accelerate's 'nccl'",
    "write_basic_config(save_location)": "Accelerate's default is a path under this machine's Hugging Face cache; the "
                                         "placeholder refuses before any path is used",
    **{f"SeedableRandomSampler({name})": "Accelerate's takes (*args, **kwargs) and passes them to torch's "
                                         "RandomSampler; trainkit's names RandomSampler's parameters"
       for name in ("args", "kwargs", "data_source", "replacement", "num_samples", "generator")},
}

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
    if isinstance(theirs, SourceDefault):
        return theirs.text in (repr(ours), getattr(ours, "__name__", None))
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


class SourceDefault(NamedTuple):
    """A default that Accelerate's source spells as an expression, not a literal (compared as text)."""

    text: str


def declared_signature(owner: type, name: str) -> inspect.Signature | None:
    """The parameters the source of ``owner.name`` declares (a decorator may hide them at run time), or None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(owner)))
    except (OSError, TypeError):
        return None
    node = next((n for n in tree.body[0].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))  # type: ignore[attr-defined]
                 and n.name == name), None)
    if node is None:
        return None
    arguments, kind = node.args, inspect.Parameter

    def value(default: ast.expr) -> Any:
        try:
            return ast.literal_eval(default)
        except ValueError:
            return SourceDefault(ast.unparse(default))

    positional = arguments.posonlyargs + arguments.args
    defaults = [kind.empty] * (len(positional) - len(arguments.defaults)) + [value(d) for d in arguments.defaults]
    parameters = [kind(a.arg, kind.POSITIONAL_ONLY if a in arguments.posonlyargs else kind.POSITIONAL_OR_KEYWORD,
                       default=d) for a, d in zip(positional, defaults)]
    if arguments.vararg:
        parameters.append(kind(arguments.vararg.arg, kind.VAR_POSITIONAL))
    parameters += [kind(a.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else value(d))
                   for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    if arguments.kwarg:
        parameters.append(kind(arguments.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _hides_parameters(signature: inspect.Signature) -> bool:
    kinds = [p.kind for p in signature.parameters.values() if p.name != "self"]
    return kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def accelerate_signature(theirs: Any, owner: type | None = None, name: str = "") -> inspect.Signature | None:
    """Accelerate's signature of ``theirs`` (``owner.name`` for a method): from its source where a decorator shows
    only ``(*args, **kwargs)`` at run time; None for a builtin without one."""
    try:
        signature = inspect.signature(theirs)
    except (TypeError, ValueError):
        return None
    if _hides_parameters(signature) and owner is not None:
        return declared_signature(owner, name) or signature
    return signature


def signature_differences(sig_theirs: inspect.Signature, ours: Any, key: str = "") -> list[str]:
    """What a call written for Accelerate's ``sig_theirs`` would find different in ``ours`` (empty when nothing).

    ``key`` names the callable for parameter-level allowances (``ALLOWED_DIFFERENCES["key(param)"]``, or
    ``"Name(param)"`` for every path)."""
    try:
        sig_ours = inspect.signature(ours)
    except (TypeError, ValueError):
        return ["trainkit's has no inspectable signature"]
    params_theirs = list(sig_theirs.parameters.values())
    params_ours = {p.name: p for p in sig_ours.parameters.values()}
    bare = key.rpartition(".")[2]

    def allowed(name: str) -> bool:
        return f"{key}({name})" in ALLOWED_DIFFERENCES or f"{bare}({name})" in ALLOWED_DIFFERENCES

    problems = []
    for index, param in enumerate(params_theirs):
        mine = params_ours.get(param.name)
        if allowed(param.name):
            continue
        if mine is None:
            problems.append(f"missing parameter {param.name!r}")
            continue
        if mine.kind != param.kind:
            problems.append(f"{param.name!r} is {mine.kind.name}, Accelerate's is {param.kind.name}")
        if not _same_default(param.default, mine.default):
            problems.append(f"{param.name!r} defaults to {mine.default!r}, Accelerate's to {param.default!r}")
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            position = list(params_ours).index(param.name)
            if position != index:
                problems.append(f"{param.name!r} is positional parameter {position}, Accelerate's is {index}")
    for name, mine in params_ours.items():
        if name in sig_theirs.parameters or allowed(name):
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
ENUMS = [e for e in FUNCTIONS if isinstance(e[2], enum.EnumMeta)]
EXCEPTIONS = [e for e in FUNCTIONS if inspect.isclass(e[2]) and issubclass(e[2], BaseException)]
EXCEPTION_NAMES = {name for _, name, _ in EXCEPTIONS}


def _params(entries: list[tuple[str, str, Any]]) -> list[Any]:
    """One pytest param per entry, id "accelerate.path.Name"."""
    return [pytest.param(*entry, id=f"{entry[0]}.{entry[1]}") for entry in entries]


def _resolve(path: str) -> Any:
    module_path, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_path), name)


def _ours(module_path: str, name: str) -> Any:
    module = importlib.import_module(_trainkit_path(module_path))
    assert hasattr(module, name), f"{_trainkit_path(module_path)}.{name} is missing (Accelerate has {module_path}.{name})"
    return getattr(module, name)


def _trainkit_target(obj: Any) -> Any:
    """The class behind one of trainkit's state aliases (``PartialState()`` returns the shared process state)."""
    return getattr(obj, "target", obj)


def _public_members(cls: type) -> dict[str, Any]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls)
            if not name.startswith("_") and name not in dir(object)}


METHODS = [(path, name, member) for path in CLASSES_WITH_METHODS
           for name, member in _public_members(_resolve(path)).items()]
NOT_DRIVEN_ENTRIES = sorted({(m, n) for m, n, _ in FUNCTIONS if n in _not_driven()})


def test_the_comparison_covers_accelerate(record_property):
    """Guards the enumeration itself: if it found nothing, every other test here would pass vacuously."""
    counts = {"callables": len(FUNCTIONS), "placeholders": len(NOT_DRIVEN_ENTRIES), "constants": len(CONSTANTS),
              "enums": len(ENUMS), "class members": len(METHODS)}
    for name, count in counts.items():
        record_property(name, count)
    logging.getLogger(__name__).info("compared %s", counts)
    assert len(FUNCTIONS) > 300 and len(NOT_DRIVEN_ENTRIES) > 60 and len(CONSTANTS) > 40 and len(ENUMS) > 10
    assert len(METHODS) > 150


@pytest.mark.parametrize("module_path, name, theirs", _params(FUNCTIONS))
def test_callable_exists_with_accelerates_signature(module_path, name, theirs):
    """Placeholders of what trainkit does not drive included: they carry Accelerate's parameters too."""
    ours = _ours(module_path, name)
    assert callable(ours), f"{_trainkit_path(module_path)}.{name} is not callable"
    if name in EXCEPTION_NAMES:
        return  # test_exception_has_accelerates_bases: an exception's signature is its builtin base's
    signature = accelerate_signature(theirs)
    assert signature is not None, f"{module_path}.{name} has no signature to compare"
    problems = signature_differences(signature, ours, f"{module_path}.{name}")
    assert not problems, f"{_trainkit_path(module_path)}.{name}: " + "; ".join(problems)


@pytest.mark.parametrize("module_path, name, theirs", _params(EXCEPTIONS))
def test_exception_has_accelerates_bases(module_path, name, theirs):
    """Code that catches Accelerate's exception by a builtin base (``except UserWarning``) catches trainkit's."""
    builtin_bases = {base for base in theirs.__mro__ if base.__module__ == "builtins"}
    assert builtin_bases <= set(_ours(module_path, name).__mro__)


@pytest.mark.parametrize("module_path, name, theirs", _params(ENUMS))
def test_enum_has_accelerates_members(module_path, name, theirs):
    members = [(member.name, member.value) for member in theirs]
    assert [(member.name, member.value) for member in _ours(module_path, name)] == members


@pytest.mark.parametrize("module_path, name, theirs", _params(CONSTANTS))
def test_constant_has_accelerates_value(module_path, name, theirs):
    ours = _ours(module_path, name)
    if reason := ALLOWED_DIFFERENCES.get(f"{module_path}.{name}"):
        pytest.skip(reason)
    assert ours == theirs


def _is_attribute(ours: Any) -> bool:
    """Read as an attribute: a property or another data descriptor, or a plain class attribute (not a method)."""
    if isinstance(ours, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
        return True
    return not callable(ours) and not isinstance(ours, (staticmethod, classmethod))


def _settable(ours: Any) -> bool:
    """Assignable on an instance: a property with a setter, a data descriptor, or a plain attribute."""
    if isinstance(ours, property):
        return ours.fset is not None
    return hasattr(ours, "__set__") or not hasattr(ours, "__get__")


@pytest.mark.parametrize("class_path, name, theirs", _params(METHODS))
def test_member_exists_as_accelerates(class_path, name, theirs):
    """Methods with Accelerate's parameters, properties as attributes (settable where Accelerate's are), class
    attributes with Accelerate's value."""
    key = f"{class_path}.{name}"
    their_cls, ours_cls = _resolve(class_path), _trainkit_target(_resolve(_trainkit_path(class_path)))
    assert hasattr(ours_cls, name), f"{ours_cls.__name__}.{name} is missing (Accelerate has {key})"
    ours = inspect.getattr_static(ours_cls, name)
    if isinstance(theirs, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
        assert _is_attribute(ours), f"{ours_cls.__name__}.{name} is {type(ours).__name__}, Accelerate's a property"
        if _settable(theirs):
            assert _settable(ours), f"{ours_cls.__name__}.{name} cannot be set (Accelerate's can)"
        return
    if not callable(getattr(their_cls, name)):
        assert getattr(ours_cls, name) == getattr(their_cls, name), f"{ours_cls.__name__}.{name}'s value"
        return
    signature = accelerate_signature(getattr(their_cls, name), their_cls, name)
    if signature is None:  # a typing alias Accelerate's class inherits from torch (Optimizer.OptimizerPreHook)
        assert getattr(ours_cls, name) == getattr(their_cls, name), f"{ours_cls.__name__}.{name}"
        return
    problems = signature_differences(signature, getattr(ours_cls, name), key)
    if isinstance(theirs, staticmethod) != isinstance(ours, staticmethod):
        problems.append("staticmethod on one side only")
    assert not problems, f"{ours_cls.__name__}.{name}: " + "; ".join(problems)


@pytest.mark.parametrize("module_path, name", NOT_DRIVEN_ENTRIES, ids=[f"{m}.{n}" for m, n in NOT_DRIVEN_ENTRIES])
def test_not_driven_names_raise_saying_why(module_path, name):
    reason = _not_driven()[name]
    with pytest.raises(NotImplementedError) as raised:
        _ours(module_path, name)()
    assert name in str(raised.value) and reason in str(raised.value)
