"""A damaged newest checkpoint under ``trainkit launch --max_restarts 2`` (CPU, 2 gloo ranks): every restart
resumes from the newest checkpoint that verifies, saves over the damaged one (kept aside), and the job ends
with bitwise the uninterrupted weights instead of dying on every restart.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import REPO, worker_env

WORKER = Path(__file__).with_name("damaged_restart_worker.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_restarts_survive_a_truncated_then_a_corrupted_newest_checkpoint(tmp_path):
    env = worker_env(TRAINKIT_CONFIG_FILE=str(tmp_path / "no_config.yaml"))
    env.pop("OMP_NUM_THREADS", None)  # the launcher decides threads per process
    command = [sys.executable, "-m", "trainkit.cli.main", "launch", "--num_processes", "2", "--cpu",
               "--max_restarts", "2", str(WORKER), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env, cwd=REPO)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    # Attempt 1 skipped the truncated checkpoint-6 (size check); attempt 2 the corrupted checkpoint-7 (checksums).
    assert outcome["attempt"] == 2 and outcome["global_step"] == 8
    assert outcome["resumed_from"].endswith("checkpoint-6")
    assert "Skipping incomplete checkpoints" in result.stderr and "checkpoint-6" in result.stderr
    assert "Skipping " in result.stderr and "checkpoint-7 for resuming" in result.stderr
    aside = sorted(name.split(".damaged-")[0] for name in outcome["entries"] if ".damaged-" in name)
    assert aside == ["checkpoint-6", "checkpoint-7"]
    assert [n for n in outcome["entries"] if n.startswith("checkpoint-") and ".damaged-" not in n] == \
        [f"checkpoint-{step}" for step in range(1, 9)]
    expected, actual = load_file(str(tmp_path / "reference.safetensors")), load_file(str(tmp_path / "resumed.safetensors"))
    assert expected.keys() == actual.keys()
    assert not [key for key in expected if not torch.equal(expected[key], actual[key])]
