"""Context parallelism with torch's own ring attention on GPUs (CUDA kernels, NCCL): the check the CPU suite cannot
make (torch's context-parallel dispatch has no CPU kernel; tests/engine/parallel/test_sequence_parallel_processes.py
runs torch's ring algorithm with SDPA's CPU kernel instead). Skipped without enough GPUs."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import ENGINE_WORKERS, run_torchrun, worker_env

pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess]

WORKER = ENGINE_WORKERS / "sequence_parallel.py"
RELATIVE = 1e-5


def _gpus(needed: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < needed:
        pytest.skip(f"needs {needed} CUDA device(s), found {torch.cuda.device_count() if torch.cuda.is_available() else 0}")


def test_torch_ring_attention_through_trainkits_kernel_matches_sdpa_on_one_gpu(tmp_path) -> None:
    """One rank (the ring is one block): trainkit's kernel reaches torch's context-parallel SDPA handlers on CUDA,
    and its output and gradients are SDPA's (fp32 within 1e-5, bf16 within 1e-2: bf16's own resolution)."""
    _gpus(1)
    run_torchrun(WORKER, "gpu_kernel", str(tmp_path), nproc=1, timeout=300, env=worker_env(device="cuda"))
    errors = torch.load(tmp_path / "gpu_kernel.pt", weights_only=False)["errors"]
    assert errors["torch.float32"] < RELATIVE and errors["torch.bfloat16"] < 1e-2


def test_context_parallel_on_two_gpus_trains_as_one_process(tmp_path) -> None:
    """CP2 (torch's ring attention, allgather and alltoall) and SP2 on 2 GPUs: per-micro-batch loss, per-step gradient
    norm and final parameters within 1e-5 relative of one process on one GPU (tiny Llama, 258 tokens, fp32)."""
    _gpus(2)
    run_torchrun(WORKER, "gpu", str(tmp_path), nproc=2, timeout=600, env=worker_env(device="cuda"))
    runs = torch.load(tmp_path / "gpu.pt", weights_only=False)
    reference = runs["reference"]
    for name in ("cp2", "cp2_alltoall", "sp2"):
        run = runs[name]
        if name.startswith("cp"):
            assert run["rotate_method"] == ("ALL_TO_ALL" if name == "cp2_alltoall" else "ALL_GATHER")
        for key in ("losses", "norms"):
            assert max(abs(a - b) / abs(b) for a, b in zip(run[key], reference[key])) < RELATIVE, (name, key)
        for param, expected in reference["params"].items():
            assert (run["params"][param] - expected).norm() / expected.norm() < RELATIVE, (name, param)
