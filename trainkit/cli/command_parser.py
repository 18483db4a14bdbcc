"""One parser per command, built the same way for ``trainkit <command>`` and for a Python caller.

Accelerate exposes each command's parser as a function (``tpu_command_parser(subparsers=None)``,
``launch_command_parser()``...) that code and tests call directly; trainkit's commands offer the same names, and
they all come here, so a parser built from Python is exactly the one the ``trainkit`` entry point uses.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

from .flag_spellings import accept_hyphen_spellings


def command_parser(name: str, module: ModuleType, subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of command ``name`` (its module's ``HELP``, ``DESCRIPTION`` if any, and ``add_arguments``), both
    flag spellings accepted.

    ``subparsers``: an ``add_subparsers()`` result to register it in (as ``trainkit``'s own parser does);
    None builds a standalone parser whose ``prog`` is ``trainkit <name>``.
    """
    options: dict[str, Any] = dict(description=getattr(module, "DESCRIPTION", module.HELP),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    if subparsers is None:
        parser = argparse.ArgumentParser(prog=f"trainkit {name}", **options)
    else:
        parser = subparsers.add_parser(name, help=module.HELP, **options)
    module.add_arguments(parser)
    accept_hyphen_spellings(parser)
    parser.set_defaults(_command_module=module)
    return parser
