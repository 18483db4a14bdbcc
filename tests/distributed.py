"""Launching real worker processes from tests: torchrun on loopback with gloo, a free port, a hard timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from trainkit.config.ignored_field import ENV_VAR as IGNORE_FIELD_ENV

REPO = Path(__file__).resolve().parents[1]
ENGINE_WORKERS = REPO / "tests" / "engine" / "workers"
"""The scripts the engine tests run in worker processes (one folder for every engine test sub-folder)."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TRACKER_ENV = {
    # log_with="all" starts every installed tracker (as in Accelerate): keep W&B offline and MLflow on a local file
    # store, so tests never need an account, a server or the network.
    "WANDB_MODE": "offline", "WANDB_SILENT": "true",
    "MLFLOW_TRACKING_URI": (Path(tempfile.gettempdir()) / "trainkit-tests-mlruns").as_uri(),
    "MLFLOW_ALLOW_FILE_STORE": "true",
}


def worker_env(device: str = "cpu", **extra: str) -> dict[str, str]:
    """The environment for workers: one thread each, the repo importable, no launcher config leaking in.

    ``device="cpu"`` (the default) hides every GPU, so the workers run on CPU with gloo whatever the
    machine has (two ranks would otherwise share one GPU, which NCCL refuses); ``device="cuda"`` keeps
    the machine's GPUs visible, for tests marked ``gpu``.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"worker_env(device={device!r}): use 'cpu' or 'cuda'.")
    # A cluster's placement (torchrun's PET_*, MASTER_ADDR/PORT) would reach `trainkit launch` as a layer too.
    # TRAINKIT_IGNORE_FIELD (the field proofs' test mode, tests/ignore_each_field.py) reaches the workers.
    env = {k: v for k, v in os.environ.items() if k == IGNORE_FIELD_ENV
           or not k.startswith(("TRAINKIT_", "RANK", "WORLD_SIZE", "LOCAL_", "PET_", "MASTER_ADDR", "MASTER_PORT"))}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(TRACKER_ENV)
    env.update(extra)
    return env


def run_torchrun(script: str | Path, *args: str, nproc: int = 2, timeout: float = 240, env: dict[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess:
    """Run ``script`` in ``nproc`` processes with torchrun; raise with both logs if it fails (unless ``check=False``).

    The default ``env`` (:func:`worker_env`) runs them on CPU with gloo; pass ``worker_env(device="cuda")``
    from a ``gpu`` test that has checked there is one GPU per rank.
    """
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *map(str, args),
    ]
    return _run(command, timeout, env, check)


def run_python(script: str | Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` as one plain process (no launcher); on CPU unless ``env`` says otherwise."""
    return _run([sys.executable, str(script), *map(str, args)], timeout, env)


def _run(command: list[str], timeout: float, env: dict[str, str] | None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or worker_env(), cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n"
            f"--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


FSDP_ISSUE_YAML = (REPO / "recipes" / "configs" / "fsdp.yaml").read_text()
"""The FSDP config file from Hugging Face's docs, shipped verbatim as recipes/configs/fsdp.yaml."""
