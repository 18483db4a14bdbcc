"""Proofs that need several processes: one launch of 2 gloo ranks on one machine, one of 2 machines of 1 process
each (two torchrun agents on loopback), shared by the fields they prove. Each launch runs once per pytest
process and ignored field (the ignore-one-field run repeats it with each field ignored)."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import REPO, free_port, run_torchrun, worker_env

from .common import ignore_mode_key

TRAINER_TESTS = Path(__file__).resolve().parents[1]


def _shared_folder() -> str:
    folder = tempfile.mkdtemp(prefix="trainkit-field-proofs-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def _two_ranks(ignored: str) -> tuple[list[dict], dict]:
    folder = _shared_folder()
    run_torchrun(TRAINER_TESTS / "fields_effects_worker.py", folder, nproc=2, timeout=280)
    ranks = [json.loads((Path(folder) / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    weights = {name: load_file(str(Path(folder) / f"{name}.safetensors")) for name in ("across", "local")}
    return ranks, weights


def two_ranks(tmp_path) -> tuple[list[dict], dict]:
    """(each rank's facts, rank 0's final weights by average_tokens_across_devices) from fields_effects_worker.py."""
    return _two_ranks(ignore_mode_key())


@functools.cache
def _two_machines(ignored: str) -> list[dict]:
    folder = _shared_folder()
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(port)]
    agents = [subprocess.Popen([*command, "--node_rank", str(rank), str(TRAINER_TESTS / "fields_nodes_worker.py"),
                                folder], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=worker_env(), cwd=REPO) for rank in (0, 1)]
    for agent in agents:
        _, stderr = agent.communicate(timeout=240)
        assert agent.returncode == 0, stderr[-4000:]
    return [json.loads((Path(folder) / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def two_machines(tmp_path) -> list[dict]:
    """Each rank's facts from fields_nodes_worker.py: rank 1 is the second machine's only process."""
    return _two_machines(ignore_mode_key())


def p_ddp_backend_gpu(tmp_path):
    """2 GPUs: ddp_backend='gloo' builds a gloo group where the default is nccl."""
    if torch.cuda.device_count() < 2:
        pytest.skip("ddp_backend chooses between backends only with 2 processes on 2 GPUs")
    run_torchrun(TRAINER_TESTS / "fields_backend_worker.py", str(tmp_path), nproc=2, timeout=240,
                 env=worker_env(device="cuda"))
    assert [json.loads((tmp_path / f"rank{rank}.json").read_text())["backend"] for rank in (0, 1)] == ["gloo"] * 2


def p_ddp_timeout(tmp_path):
    ranks, _ = two_ranks(tmp_path)
    assert [facts["timeout_s"] for facts in ranks] == [123.0, 123.0]  # what torch's gloo group holds (default 1800)


def ddp_setting(tmp_path, name: str) -> list:
    ranks, _ = two_ranks(tmp_path)
    assert {facts["ddp"]["type"] for facts in ranks} == {"DistributedDataParallel"}
    return [facts["ddp"][name] for facts in ranks]


def p_ddp_find_unused_parameters(tmp_path):
    assert ddp_setting(tmp_path, "find_unused_parameters") == [True, True]


def p_ddp_bucket_cap_mb(tmp_path):
    assert ddp_setting(tmp_path, "bucket_bytes_cap") == [5 * 1024 * 1024] * 2  # torch's default: 25 MiB


def p_ddp_broadcast_buffers(tmp_path):
    assert ddp_setting(tmp_path, "broadcast_buffers") == [False, False]


def p_ddp_static_graph(tmp_path):
    assert ddp_setting(tmp_path, "static_graph") == [True, True]


def p_average_tokens(tmp_path):
    """The ranks count different label items: the mean over all of them (default) and the mean of the ranks'
    means train differently (on one process they are the same thing)."""
    _, weights = two_ranks(tmp_path)
    across, local = weights["across"], weights["local"]
    assert any(not torch.equal(across[key], local[key]) for key in across)


def p_accelerator_config(tmp_path):
    """split_batches=True: per_device_train_batch_size=4 is the batch of both ranks together, 2 rows each."""
    ranks, _ = two_ranks(tmp_path)
    assert [facts["batch_rows"] for facts in ranks] == [[2, 2], [2, 2]]  # default: 4 rows on each rank


def sharded_across_ranks(tmp_path, run: str) -> bool:
    """Every parameter a DTensor, each rank holding a part and the two parts the whole (DDP: the whole on each)."""
    parts = [facts[run] for facts in two_ranks(tmp_path)[0]]
    fractions = [part["local_fraction"] for part in parts]
    return all(part["all_dtensor"] for part in parts) and max(fractions) < 1 and abs(sum(fractions) - 1) < 1e-9


def p_parallelism_config(tmp_path):
    assert sharded_across_ranks(tmp_path, "parallelism")  # ParallelismConfig(dp_shard_size=2): FSDP2 on 2 ranks


def p_fsdp(tmp_path):
    assert sharded_across_ranks(tmp_path, "fsdp")


def p_fsdp_config(tmp_path):
    """state_dict_type=SHARDED_STATE_DICT: the checkpoint holds DCP shards, not one model file (the default)."""
    files = two_ranks(tmp_path)[0][0]["fsdp"]["checkpoint_files"]
    assert "pytorch_model_fsdp_0" in files and "model.safetensors" not in files, files


def p_log_on_each_node(tmp_path):
    """log_on_each_node=False with log_level='debug': the second machine's main process stays at the replica level
    (by default it logs like the job's main process)."""
    lines = [facts["log_on_each_node"] for facts in two_machines(tmp_path)]
    assert lines[0] > 0 and lines[1] == 0, lines


def p_log_level_replica(tmp_path):
    lines = [facts["log_level_replica"] for facts in two_machines(tmp_path)]
    assert lines[1] > 0, lines  # default 'warning': no debug line on the replica


def p_save_on_each_node(tmp_path):
    """Each machine writes its part of every checkpoint on its own disk: the Trainer's checkpoints go through the
    per-machine storage (the default: one folder every process shares). Written and resumed per node in
    tests/engine/checkpoint/test_checkpoint_layouts_processes.py and test_async_checkpoint_processes.py."""
    from tests.trainer.checkpoint_workload import make_trainer
    from trainkit.engine.checkpoint.storage import NodeLocalStorage

    trainer = make_trainer(str(tmp_path / "out"), save_on_each_node=True)
    storage = trainer.accelerator.checkpointer.storage_for(trainer.args.output_dir)
    assert isinstance(storage, NodeLocalStorage) and storage.by_machine


__all__ = [name for name in dir() if name.startswith("p_")]
