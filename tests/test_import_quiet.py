"""Importing trainkit is as quiet as importing torch: no DeprecationWarning of its own making (CPU, subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _warnings_of(code: str, *flags: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    return done.returncode, [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]


def test_the_issue_command_is_quiet():
    code, lines = _warnings_of("import trainkit, trainkit.engine", "-W", "error::DeprecationWarning")
    assert code == 0 and lines == []


def test_the_public_names_add_no_deprecation_warning_to_torchs_own():
    _, torch_alone = _warnings_of("import torch", "-W", "always::DeprecationWarning")
    _, ours = _warnings_of("import trainkit, trainkit.engine, trainkit.engine.accelerator, trainkit.utils\n"
                           "from trainkit import Accelerator, DistributedType, FullyShardedDataParallelPlugin",
                           "-W", "always::DeprecationWarning")
    assert [line for line in ours if line not in torch_alone] == []
