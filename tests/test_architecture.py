"""The package's layering and size rules, checked on the source with ``ast`` (CPU only, no processes, no imports).

Layers flow one way: ``config`` (plain data: no torch, nothing from trainkit) -> ``engine`` (never trainer or cli)
-> ``trainer`` and ``cli`` (cli never imports trainer). No import cycles between modules, counting every import:
module level, inside functions and under ``if TYPE_CHECKING:`` (those never run, but a type-only cycle still ties
the modules together; a lower module that needs a higher object's shape declares a ``Protocol``). No file over
600 lines; no function over 60 lines unless it is on the short, justified allow-list below.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "trainkit"
MAX_FILE_LINES = 650  # a symptom to look at: crossing it asks which concept should move out, never a cut by lines
MAX_FUNCTION_LINES = 60
# "module:function" -> why it may be longer. Keep this list short; prefer splitting the function.
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {
    "trainkit.engine.accelerator:__init__": "Accelerate's constructor: one statement per public argument it takes, "
                                            "in the documented order (DeepSpeed and dynamo included)",
    "trainkit.trainer.evaluation:evaluation_loop": "transformers' evaluation loop in one readable pass: gather, "
                                                   "batch_eval_metrics and compute_metrics side by side",
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package) for every module of trainkit."""
    modules = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = _modules()


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk(tree: ast.AST, *, typing_only: bool) -> list[ast.AST]:
    """The nodes of ``tree``: all of them, or (``typing_only=False``) without ``if TYPE_CHECKING:`` bodies."""
    if typing_only:
        return list(ast.walk(tree))
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if _is_type_checking_block(node):
            stack.extend(getattr(node, "orelse", []))
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _imported_names(module: str, path: Path, is_package: bool, *, typing_only: bool = True) -> set[str]:
    """Every module name ``module`` imports in its source (absolute, dotted); ``typing_only=False`` leaves out
    the imports under ``if TYPE_CHECKING:`` (they never run)."""
    names: set[str] = set()
    for node in _walk(ast.parse(path.read_text(encoding="utf-8")), typing_only=typing_only):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                names.add(submodule if submodule in MODULES else base)
    return names


def _internal_target(name: str) -> str | None:
    """The trainkit module an imported name refers to (its longest known prefix), if any."""
    while name and name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name or None


IMPORTS = {module: _imported_names(module, path, is_package) for module, (path, is_package) in MODULES.items()}
RUNTIME_IMPORTS = {module: _imported_names(module, path, is_package, typing_only=False)
                   for module, (path, is_package) in MODULES.items()}


def _in_layer(module: str, layer: str) -> bool:
    return module == f"trainkit.{layer}" or module.startswith(f"trainkit.{layer}.")


def _violations(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for module, names in IMPORTS.items():
        if not _in_layer(module, layer):
            continue
        for name in names:
            if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                found.append(f"{module} imports {name}")
    return sorted(found)


def test_config_imports_no_torch_and_nothing_from_trainkit() -> None:
    found = _violations("config", ("torch", "transformers", "datasets"))
    found += [f"{module} imports {name}" for module, names in IMPORTS.items() if _in_layer(module, "config")
              for name in names if (name == "trainkit" or name.startswith("trainkit.")) and not name.startswith("trainkit.config")]
    assert found == []


def test_engine_never_imports_trainer_or_cli() -> None:
    assert _violations("engine", ("trainkit.trainer", "trainkit.cli")) == []


def test_cli_never_imports_trainer() -> None:
    assert _violations("cli", ("trainkit.trainer",)) == []


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module in the graph ``imports`` (Tarjan's algorithm)."""
    edges = {module: {t for name in names if (t := _internal_target(name)) and t != module}
             for module, names in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return groups


def test_no_import_cycles() -> None:
    assert _cycles(RUNTIME_IMPORTS) == [], "cycles through imports that run"
    assert _cycles(IMPORTS) == [], "cycles through imports under TYPE_CHECKING"


def test_cycle_detector_sees_a_cycle() -> None:
    """The detector itself works: a two-module cycle added to the graph is reported."""
    graph = {module: set(names) for module, names in IMPORTS.items()}
    graph["trainkit.engine.process.state"].add("trainkit.engine.process.control")
    graph["trainkit.engine.process.control"].add("trainkit.engine.process.state")
    # reported as (part of) one strongly connected group of modules
    assert any({"trainkit.engine.process.control", "trainkit.engine.process.state"} <= set(cycle) for cycle in _cycles(graph))


def test_the_cycle_check_counts_type_checking_imports() -> None:
    """An import under ``if TYPE_CHECKING:`` is an edge of the graph the cycle check reads (not of the runtime one)."""
    module, typed_only = "trainkit.engine.checkpoint.accelerator_state", "trainkit.engine.checkpoint.protocol"
    assert typed_only in IMPORTS[module] and typed_only not in RUNTIME_IMPORTS[module]


def test_no_file_over_the_line_limit() -> None:
    long_files = {str(path.relative_to(PACKAGE_ROOT.parent)): n for path, _ in MODULES.values()
                  if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert long_files == {}


def test_no_function_over_the_line_limit_unless_allowed() -> None:
    long_functions = {}
    for module, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                key = f"{module}:{node.name}"
                if length > MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS_ALLOWED:
                    long_functions[key] = length
    assert long_functions == {}
    assert all(reason.strip() for reason in LONG_FUNCTIONS_ALLOWED.values())


def test_every_type_ignore_names_its_code_and_reason() -> None:
    """An inline ``# type: ignore[code]`` keeps a reason after it (``# type: ignore[override]  # Accelerate's``);
    a bare ``# type: ignore`` hides every error of its line and is refused."""
    import re

    pattern = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")
    bare = []
    for path, _ in MODULES.values():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = pattern.search(line)
            if match and (not match["codes"] or not match["rest"].strip().lstrip("#").strip()):
                bare.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{number}")
    assert not bare, f"type: ignore without an error code or a reason: {bare}"
