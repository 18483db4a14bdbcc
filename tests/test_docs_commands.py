"""Every shell command the docs show runs as documented, or is listed below with the reason it cannot run here.

The commands are read from the ```bash blocks of docs/*.md and README.md. Each is either run (CPU only,
offline, in a scratch folder: stand-in `train.py` scripts and config files where the docs assume the
reader's own, and small sizes where the documented run takes minutes) and its output checked, or named in
SKIPPED with why (GPUs, several machines, Slurm, network, benchmarks). A new command in the docs fails
`test_every_documented_command_is_run_or_skipped_with_a_reason` until it is given one or the other.
The fast cases (configs, env, merge-weights, two 2-process launches) take well under a minute on 2 idle
cores; FSDP launches and recipe trainings are marked `slow`.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.distributed import REPO, worker_env

DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
SLURM = "Slurm job script: needs a Slurm cluster (srun, scontrol, SLURM_* variables)"
SKIPPED: dict[str, str] = {
    "git clone <this repository> trainkit && cd trainkit": "network (and a placeholder URL)",
    "bash scripts/main.sh": "creates .venv/ and installs packages from the registry (network); the command it "
                            "runs is the recipes.md launch of trainer_mnist_cnn.py, which runs here",
    "bash scripts/test.sh": "the whole test suite (this test is part of it); creates .venv/ (network)",
    "trainkit launch --nnodes 1 --nproc_per_node 2 train.py": "the same 2-process launch runs in "
        "tests/cli/test_torchrun_spellings.py::test_nnodes_nproc_per_node_trains_on_two_processes",
    "trainkit launch --num_processes 8 train.py": "8 GPUs (8 processes on CPU would say nothing the 2-process "
                                                  "launches here do not)",
    "python recipes/imdb/trainer_imdb_finetune.py --bf16": "downloads bert-base-uncased and IMDB (network), "
                                                           "meant for a GPU",
    "trainkit launch --config_file recipes/configs/ddp.yaml --num_processes 8 recipes/imdb/trainer_imdb_finetune.py":
        "8 GPUs; bert-base-uncased and IMDB (network)",
    "trainkit launch --num_processes 8 recipes/mnist/native_mnist_cnn.py": "8 GPUs; MNIST download (network)",
    "trainkit launch --config_file recipes/configs/fsdp.yaml recipes/imdb/trainer_imdb_finetune.py":
        "bert-base-uncased and IMDB (network); README's --synthetic form of this launch runs here",
    "trainkit launch --config_file recipes/configs/fsdp_offload.yaml recipes/imdb/trainer_imdb_finetune.py":
        "bert-base-uncased and IMDB (network)",
    "trainkit launch --config_file recipes/configs/multinode.yaml --machine_rank 0 "
    "recipes/imdb/trainer_imdb_finetune.py": "two machines",
    "trainkit launch --config_file recipes/configs/multinode.yaml --machine_rank 1 "
    "recipes/imdb/trainer_imdb_finetune.py": "two machines",
    "trainkit launch --num_machines 2 --machine_rank 0": "two machines (docs/cli.md shows both side by side)",
    "PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=": "two launchers at once, one per machine; "
                                                       "tests/cli/test_cluster_env.py runs exactly these on loopback",
    "trainkit launch --num_machines 1:2 --max_restarts 3": "two machines, one leaving and rejoining; "
                                                           "tests/cli/test_elastic_launch.py runs these on loopback",
    ".venv/bin/python benchmarks/": "a benchmark: minutes of CPU, run by hand (benchmarks/README.md)",
    "python -m pytest tests/ignore_each_field.py": "the ignore-one-field check: every field proof run with its field "
                                                   "ignored, 4-9 minutes; run by hand, not in CI",
    "python benchmarks/fsdp_step_memory.py --device cuda": "a benchmark on a GPU (docs/fsdp.md's figures for CUDA)",
    # docs/cli.md: Accelerate's other commands, each run by tests/cli/test_accelerate_commands.py on local files
    "trainkit test --config_file my.yaml": "my.yaml is a placeholder; tests/cli/test_cli_launch.py::"
                                           "test_trainkit_test_runs_the_self_check_on_two_processes runs the command",
    "trainkit estimate-memory bert-base-cased": "reads the model's config from the Hub (network); "
                                                "test_estimate_memory_of_a_local_model_matches_the_built_model runs it "
                                                "on a local folder",
    "trainkit to-fsdp2 --config_file fsdp1.yaml": "fsdp1.yaml is a placeholder; "
                                                  "test_to_fsdp2_rewrites_fsdp1_keys_and_trainkit_reads_the_same_sharding",
    "trainkit tpu-config --tpu_name pod": "a Google Cloud TPU pod and gcloud; "
                                          "test_tpu_config_prints_the_gcloud_command_from_flags runs the --debug form",
    # docs/clusters-ray.md: Ray is an optional extra, absent from the tests' default environment
    "pip install 'trainkit[ray]'": "installs Ray from the registry (network)",
    "python -m pytest tests/cluster/test_ray_train.py": "the Ray Train tests themselves (skipped without Ray)",
    "python tests/cluster/scripts/ray_driver.py": "needs Ray; tests/cluster/test_ray_train.py runs exactly this",
    "trainkit launch --num_processes 2 tests/cluster/scripts/": "the reference runs of tests/cluster/test_ray_train.py "
                                                                "(which runs them beside the Ray runs)",
}


def _logical_lines(block: str) -> list[str]:
    """Commands of a bash block: continuations joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in block.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        command = " ".join(re.sub(r"\s#.*$", "", current).split())
        if command and not command.startswith("#"):
            commands.append(command)
        current = ""
    return commands


def documented_commands() -> list[tuple[str, str, str | None]]:
    """(doc, command, skip reason or None) for every command of every ```bash block."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            for command in _logical_lines(block):
                reason = SLURM if ("srun " in block or "#SBATCH" in block) else next(
                    (why for prefix, why in SKIPPED.items() if command.startswith(prefix)), None)
                found.append((doc.name, command, reason))
    return found


# ------------------------------------------------------------------------------------------------- runs
STAND_IN_SCRIPT = (REPO / "tests" / "cli" / "scripts" / "reader_train.py").read_text()  # a reader's train.py
MY_YAML = "distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: bf16\n"
SAVE_CHECKPOINT_7 = '''
import torch
from trainkit import Accelerator
from trainkit.utils import ProjectConfiguration
from safetensors.torch import save_file

torch.manual_seed(0)
accelerator = Accelerator(project_config=ProjectConfiguration(project_dir="runs/exp1", automatic_checkpoint_naming=True,
                                                              iteration=7))
model = accelerator.prepare(torch.nn.Linear(4, 3))
accelerator.save_state()
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "expected.safetensors")
'''
SMALL_MNIST = ["--num_train", "256", "--num_test", "64", "--epochs", "1", "--report_to", "none"]
SMALL_IMDB = ["--num_train", "64", "--num_test", "32", "--epochs", "1", "--report_to", "none"]


@dataclass
class Case:
    extra: list[str]
    """Arguments appended for small settings (or to run offline where the doc's form downloads data)."""
    check: Callable[[subprocess.CompletedProcess, Path], None]
    slow: bool = False
    stdin: str | None = None
    prepare: Callable[[Path], None] | None = None


def _reports(output: str) -> dict[int, dict]:
    decoder = json.JSONDecoder()
    found = {}
    for piece in output.split("REPORT ")[1:]:
        report, _ = decoder.raw_decode(piece)
        found[report["rank"]] = report
    return found


def _ranks(world: int, distributed_type: str, **expected):
    def check(result: subprocess.CompletedProcess, folder: Path) -> None:
        found = _reports(result.stdout)
        assert sorted(found) == list(range(world)), found
        for report in found.values():
            assert report["world"] == world and report["distributed_type"] == distributed_type, report
            assert report["loss_finite"]
            for key, value in expected.items():
                assert report[key] == value, (key, report)
    return check


def _config_written(key: str, value: str):
    def check(result: subprocess.CompletedProcess, folder: Path) -> None:
        assert "configuration saved at" in result.stdout
        text = (folder / "default_config.yaml").read_text()
        assert f"{key}: {value}" in text, text
    return check


def _show_check(result: subprocess.CompletedProcess, folder: Path) -> None:
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("  ")
            and len(line.split()) > 1}
    assert rows["num_processes"][:3] == ["4", "flag", "--num_processes"], rows["num_processes"]
    assert rows["mixed_precision"] == ["bf16", "my.yaml"], rows["mixed_precision"]
    assert "Engine settings a launched script receives" in result.stdout


def _merged(result: subprocess.CompletedProcess, folder: Path) -> None:
    from safetensors.torch import load_file

    merged, expected = load_file(folder / "exported" / "model.safetensors"), load_file(folder / "expected.safetensors")
    assert merged.keys() == expected.keys() and all(merged[k].equal(expected[k]) for k in expected)


def _mnist_trained(result: subprocess.CompletedProcess, folder: Path) -> None:
    assert "test accuracy" in result.stdout + result.stderr
    assert (folder / "outputs" / "mnist" / "model.safetensors").is_file()


def _native_trained(result: subprocess.CompletedProcess, folder: Path) -> None:
    assert "epoch 0: test accuracy" in result.stdout
    results = json.loads((folder / "outputs" / "mnist_native" / "results.json").read_text())
    assert results and (folder / "outputs" / "mnist_native" / "model.safetensors").is_file()


def _imdb_trained(result: subprocess.CompletedProcess, folder: Path) -> None:
    assert "test accuracy" in result.stdout
    assert (folder / "outputs").is_dir()


def _write(name: str, text: str) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return prepare


def _fsdp_yaml_from_docs(folder: Path) -> None:
    """docs/fsdp.md's own YAML, as the reader would save it next to train.py."""
    text = (REPO / "docs" / "fsdp.md").read_text()
    (folder / "fsdp.yaml").write_text(re.search(r"```yaml\n(distributed_type: FSDP.*?)```", text, re.S).group(1))


def _run_python(code: str) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        subprocess.run([sys.executable, "-c", code], cwd=folder, env=_env(folder), check=True, timeout=120,
                       capture_output=True)
    return prepare


RUN: dict[str, Case] = {
    "trainkit config": Case([], _config_written("compute_environment", "LOCAL_MACHINE"), stdin=""),
    "trainkit config --default --mixed_precision bf16": Case([], _config_written("mixed_precision", "bf16")),
    "trainkit config --show --config_file my.yaml --num_processes 4": Case([], _show_check,
                                                                          prepare=_write("my.yaml", MY_YAML)),
    "trainkit launch --config_file my.yaml train.py --lr 3e-4": Case(
        [], _ranks(2, "MULTI_CPU", mixed_precision="bf16", argv=["--lr", "3e-4"]), prepare=_write("my.yaml", MY_YAML)),
    "trainkit launch --num_processes 2 -m mypackage.train": Case(
        [], _ranks(2, "MULTI_CPU"), prepare=_write("mypackage/train.py", STAND_IN_SCRIPT)),
    "trainkit env": Case([], lambda result, folder: ("torch version" in result.stdout) or pytest.fail(result.stdout)),
    "trainkit merge-weights runs/exp1/checkpoints/checkpoint_7 exported/": Case(
        [], _merged, prepare=_run_python(SAVE_CHECKPOINT_7)),
    "python train.py": Case([], _ranks(1, "NO")),
    "trainkit launch --config_file recipes/configs/fsdp.yaml train.py": Case(
        [], _ranks(2, "FSDP", mixed_precision="bf16"), slow=True),
    "trainkit launch --config_file fsdp.yaml train.py": Case([], _ranks(2, "FSDP", mixed_precision="bf16"),
                                                             prepare=_fsdp_yaml_from_docs, slow=True),
    "diff recipes/mnist/pytorch_mnist_cnn.py recipes/mnist/native_mnist_cnn.py": Case(
        [], lambda result, folder: ("Accelerator" in result.stdout) or pytest.fail(result.stdout)),
    "trainkit launch --config_file recipes/configs/single.yaml recipes/mnist/native_mnist_cnn.py": Case(
        ["--synthetic", "--num_train", "256", "--num_test", "64", "--epochs", "1"], _native_trained, slow=True),
    "python recipes/mnist/trainer_mnist_cnn.py --synthetic": Case(SMALL_MNIST, _mnist_trained, slow=True),
    "trainkit launch --num_processes 2 recipes/mnist/trainer_mnist_cnn.py --synthetic": Case(
        SMALL_MNIST, _mnist_trained, slow=True),
    "trainkit launch --config_file recipes/configs/fsdp.yaml --fsdp_auto_wrap_policy NO_WRAP "
    "recipes/mnist/trainer_mnist_cnn.py": Case(["--synthetic", *SMALL_MNIST], _mnist_trained, slow=True),
    "python recipes/imdb/trainer_imdb_finetune.py --synthetic": Case(SMALL_IMDB, _imdb_trained, slow=True),
    "trainkit launch --config_file recipes/configs/fsdp.yaml recipes/imdb/trainer_imdb_finetune.py --synthetic": Case(
        SMALL_IMDB, _imdb_trained, slow=True),
}
# Exit codes other than 0 that a command documents: diff says "the files differ" with 1.
EXPECTED_EXIT = {"diff recipes/mnist/pytorch_mnist_cnn.py recipes/mnist/native_mnist_cnn.py": 1}


def _env(folder: Path) -> dict[str, str]:
    """CPU only, offline, the scratch folder's own default config; the repo and the folder importable."""
    env = worker_env(TRAINKIT_CONFIG_FILE=str(folder / "default_config.yaml"), HF_HUB_OFFLINE="1",
                     HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = f"{REPO}:{folder}"
    env.pop("OMP_NUM_THREADS", None)
    return env


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "trainkit":
        return [sys.executable, "-m", "trainkit.cli.main", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def test_every_documented_command_is_run_or_skipped_with_a_reason():
    commands = documented_commands()
    unplaced = [(doc, command) for doc, command, reason in commands if reason is None and command not in RUN]
    assert not unplaced, f"documented commands neither run nor skipped here: {unplaced}"
    shown = {command for _, command, _ in commands}
    stale = [command for command in RUN if command not in shown]
    assert not stale, f"RUN lists commands the docs no longer show: {stale}"
    stale_skips = [prefix for prefix in SKIPPED if not any(command.startswith(prefix) for command in shown)]
    assert not stale_skips, f"SKIPPED lists commands the docs no longer show: {stale_skips}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("command", [pytest.param(command, marks=[pytest.mark.slow] if case.slow else [],
                                                  id=re.sub(r"\W+", "-", command)[:70])
                                     for command, case in RUN.items()])
def test_documented_command_runs_on_cpu(command, tmp_path):
    """CPU (every GPU hidden), offline, in a scratch folder holding stand-ins for the reader's files."""
    case = RUN[command]
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    (tmp_path / "train.py").write_text(STAND_IN_SCRIPT)
    if case.prepare is not None:
        case.prepare(tmp_path)
    result = subprocess.run(_argv(command) + case.extra, cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                            text=True, timeout=300, input=case.stdin if case.stdin is not None else "")
    assert result.returncode == EXPECTED_EXIT.get(command, 0), \
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}"
    case.check(result, tmp_path)
