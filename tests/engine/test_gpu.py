"""The engine's process tests again on CUDA (NCCL with 2 GPUs, else one GPU), with bf16 and fp16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_python, run_torchrun, worker_env

WORKER = Path(__file__).parent / "workers" / "engine_checks.py"


@pytest.mark.gpu
def test_engine_claims_on_cuda(tmp_path):
    world = min(torch.cuda.device_count(), 2)
    env = worker_env(device="cuda")
    run_python(WORKER, tmp_path, env=env) if world == 1 else run_torchrun(WORKER, tmp_path, nproc=world, env=env)
    report = json.loads((tmp_path / "report_rank0.json").read_text())
    assert report["distributed_type"] == ("NO" if world == 1 else "MULTI_GPU")
    ours, reference = load_file(tmp_path / "ddp_b4_k1_n32.safetensors"), load_file(tmp_path / "reference_n32.safetensors")
    assert max((ours[k].cpu() - reference[k]).abs().max().item() for k in ours) <= 1e-4  # TF32 kernels on GPU
    for mode in ("bf16", "fp16"):
        assert report["precision"][mode]["changed"]
    assert report["precision"]["fp16"]["overflow_skipped"]
    assert report["gather_for_metrics"]["n13_split0"]["tensors"] == list(range(13))
