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


def _imported_from(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a ``from ... import`` in ``module`` reads from (relative levels resolved)."""
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return base


def _imported_names(module: str, path: Path, is_package: bool, *, typing_only: bool = True) -> set[str]:
    """Every module name ``module`` imports in its source (absolute, dotted); ``typing_only=False`` leaves out
    the imports under ``if TYPE_CHECKING:`` (they never run)."""
    names: set[str] = set()
    for node in _walk(ast.parse(path.read_text(encoding="utf-8")), typing_only=typing_only):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _imported_from(module, node, is_package)
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


ENGINE_FACE = "trainkit.engine"
"""The engine's one face (``trainkit/engine/__init__.py``): the only engine module ``trainer/`` and ``cli/`` import."""
FACE_CLIENT_LAYERS = ("trainer", "cli")
FACE_CLIENTS_MAY_ALSO_IMPORT = ("trainkit.config", "trainkit.version")
"""Besides the face and their own layer: plain data (``config``) and the version numbers (a leaf module)."""


def _face_names() -> set[str]:
    """The names the face offers: its ``_EXPORTS`` table and its own functions (read from the source)."""
    names: set[str] = set()
    tree = ast.parse((PACKAGE_ROOT / "engine" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "_EXPORTS" and isinstance(node.value, ast.Dict):
            names.update(key.value for key in node.value.keys if isinstance(key, ast.Constant))
        elif isinstance(target, ast.Name) and target.id == "FACE_FUNCTIONS" and isinstance(node.value, ast.Tuple):
            names.update(element.value for element in node.value.elts if isinstance(element, ast.Constant))
    return names


def _face_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """What ``module`` (in trainer/ or cli/) imports from trainkit other than the engine's face, config, the
    version and its own layer, and any name it takes from the face that the face does not offer."""
    layer = module.split(".")[1]
    offered, found = _face_names(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imports = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports = [(_imported_from(module, node, is_package), [alias.name for alias in node.names])]
        else:
            continue
        for target, names in imports:
            if target != "trainkit" and not target.startswith("trainkit."):
                continue
            where = f"{module}:{node.lineno}"
            if target == ENGINE_FACE:
                found += [f"{where} imports {name} from trainkit.engine, which the face does not offer (add it to "
                          "trainkit/engine/__init__.py as a capability, not an internal)" for name in names
                          if name not in offered]
            elif not _in_layer(target, layer) and not any(_in_layer(target, allowed.split(".", 1)[1])
                                                           for allowed in FACE_CLIENTS_MAY_ALSO_IMPORT):
                found.append(f"{where} imports {target}: trainer/ and cli/ use the engine only through its face; "
                             f"import from trainkit.engine (see its docstring) instead")
    return found


def test_trainer_and_cli_use_the_engine_only_through_its_face() -> None:
    found = []
    for module, (path, is_package) in MODULES.items():
        if any(_in_layer(module, layer) for layer in FACE_CLIENT_LAYERS):
            found += _face_violations(module, path.read_text(encoding="utf-8"), is_package)
    assert found == [], "\n".join(found)


def test_the_face_rule_sees_an_engine_internal_and_an_unoffered_name() -> None:
    source = ("from trainkit.engine.process.state import ProcessState\n"
              "def f():\n    from trainkit.engine import no_such_capability\n    import trainkit.utils.random\n"
              "from trainkit.engine import Accelerator\nfrom trainkit.config import ConfigError\nfrom .data import x\n")
    found = _face_violations("trainkit.trainer.example", source)
    assert [line.split(" ", 2)[:2] for line in found] == [
        ["trainkit.trainer.example:1", "imports"], ["trainkit.trainer.example:3", "imports"],
        ["trainkit.trainer.example:4", "imports"]], found
    assert "trainkit.engine.process.state" in found[0] and "no_such_capability" in found[1]


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
