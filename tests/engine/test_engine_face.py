"""The engine's face, ``trainkit.engine`` (CPU, no processes): every name it offers loads, the names it gives the type
checker are the ones it loads, and importing it loads no engine module (names load on first use).

The rule that ``trainer/`` and ``cli/`` import the engine only through it is in ``tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trainkit.engine as face

FACE_FILE = Path(face.__file__)


def test_every_name_the_face_offers_loads() -> None:
    missing = [name for name in face.__all__ if getattr(face, name, None) is None]
    assert missing == []


def test_the_type_checker_sees_the_names_the_face_loads() -> None:
    tree = ast.parse(FACE_FILE.read_text(encoding="utf-8"))
    checking = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.asname or alias.name for node in checking.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert set(face._EXPORTS) <= typed, sorted(set(face._EXPORTS) - typed)


def test_an_unknown_name_is_an_attribute_error_naming_what_the_face_offers() -> None:
    try:
        face.no_such_capability  # noqa: B018
    except AttributeError as error:
        assert "no_such_capability" in str(error) and "Accelerator" in str(error)
    else:
        raise AssertionError("the face offered a name it does not have")


def test_importing_the_face_loads_no_engine_module_and_no_torch() -> None:
    code = ("import sys, trainkit.engine; loaded = [m for m in sys.modules if m.startswith('trainkit.engine.') or m == 'torch'];"
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=FACE_FILE.parents[2]).stdout.strip()
    assert out == "[]"
