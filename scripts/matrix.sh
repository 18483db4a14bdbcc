#!/usr/bin/env bash
# Run one compatibility cell of the CI matrix: its own venv (scripts/matrix_venv.sh, reused when unchanged)
# and a subset of the tests, on CPU (gpu-image: every in-process test, then chosen multi-process ones).
# The main job (Python 3.11, torch 2.13 CPU, newest transformers, whole suite) is scripts/test.sh.
#   usage: scripts/matrix.sh CELL [pytest args...]     CELL: gpu-image | oldest
# Venvs live in $TRAINKIT_MATRIX_VENVS (default ~/.cache/trainkit/matrix), outside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PYENV_VERSIONS=${PYENV_ROOT:-$HOME/.pyenv}/versions
VENVS=${TRAINKIT_MATRIX_VENVS:-$HOME/.cache/trainkit/matrix}

python_of() {  # the newest installed pyenv Python of a minor version, e.g. 3.12
  local found
  found=$(ls -d "$PYENV_VERSIONS/$1".* 2>/dev/null | sort -V | tail -1)
  [ -n "$found" ] || { echo "[matrix] no Python $1 under $PYENV_VERSIONS" >&2; exit 3; }
  echo "$found/bin/python"
}

cell=${1:-}
shift || true
units=()  # a cell's in-process run, before its listed tests (empty: the listed tests only)
case "$cell" in
  gpu-image)
    # The stack of the CUDA image users run (Python 3.12, torch 2.11, transformers 5.17), here on CPU, with
    # the core dependencies only (no Accelerate, no trackers: as users install trainkit): every in-process test,
    # then the multi-process tests that drive version-dependent code of torch or transformers: torchrun's agent
    # (rendezvous, restarts, exit codes, error files), FSDP2/DCP/DTensor (checkpoints, the FSDP YAML launch, N-D
    # and sequence parallelism), torch.compile before sharding, transformers' loading flags and TP plans.
    # Left to the main job (torch 2.13), as trainkit's own logic over a path a listed test already drives here:
    # the Trainer's preemption chain (the engine's preemption test: signal, exit 75, torchrun's restart; the
    # signal relay's unit tests run in-process), the Trainer's kill-while-writing restart (the engine's
    # SIGKILL-while-writing test, the launcher's --max_restarts test), the recipes' CPU trainings (DDP, FSDP2
    # and its gathered save: the checkpoint tests), the FSDP strategy matrix, the glibc allocator probe.
    python=$(python_of 3.12) specs=(torch==2.11.0 transformers==5.17.0)
    units=(tests -m "not multiprocess and not slow")
    tests=(-m "multiprocess or slow" tests/cli/test_cli_launch.py tests/engine/process/test_preemption_engine.py
           tests/engine/checkpoint/test_checkpoint_processes.py tests/trainer/checkpointing/test_checkpoints_processes.py
           tests/recipes/test_recipes.py::test_plain_and_accelerator_mnist_loops_agree_on_one_gpu  # where there is one
           tests/engine/strategies/fsdp/test_fsdp_pretrained_loading.py  # no accelerate here, as for users
           # N-D parallelism on transformers 5.17's plans (~30 s); the pretrained one skips here: transformers'
           # from_pretrained(distributed_config=...) needs accelerate (checked in a venv with it, ~25 s)
           tests/engine/strategies/test_nd_parallel_processes.py tests/engine/strategies/test_nd_parallel_pretrained.py
           tests/engine/parallel
           -k "not test_a_rank_killed_while_writing_restarts")
    ;;
  oldest)
    # The oldest declared Python, torch, transformers, datasets and evaluate (pyproject.toml's lower bounds):
    # unit tests of every layer, the datasets-based ones, and one launch; no long multi-process chains.
    python=$(python_of 3.10) specs=(torch==2.11.0 transformers==5.1.0 datasets==4.0.0 evaluate==0.4.6)
    tests=(tests/config tests/cli/test_cli_units.py tests/cli/test_torchrun_compat.py tests/cli/test_preemption_settings.py
           tests/engine/checkpoint/test_checkpoint_units.py tests/engine/test_accelerator_unit.py tests/engine/strategies/fsdp/test_fsdp_options.py
           tests/trainer/test_arguments.py tests/test_architecture.py tests/recipes/test_synthetic_data.py
           tests/trainer/test_stream_units.py
           tests/trainer/test_argument_fields.py tests/trainer/test_argument_wiring.py  # the release's own fields
           tests/trainer/test_optim.py tests/trainer/seq2seq/test_seq2seq.py  # optim names, Seq2Seq fields: 5.1's own
           tests/trainer/test_built_here.py  # what a plain module's run builds itself, against 5.1's own
           tests/engine/parallel/test_sequence_split.py  # sp/cp against 5.1's attention registry and models
           "tests/cli/test_cli_launch.py::test_two_processes_with_flags_overriding_the_file")
    ;;
  *)
    echo "usage: $0 gpu-image|oldest [pytest args...]" >&2
    exit 2
    ;;
esac
venv="$VENVS/$cell"
bash scripts/matrix_venv.sh "$venv" "$python" "${specs[@]}"
"$venv/bin/python" -c 'import sys, torch, transformers; print(f"[matrix] {sys.argv[1]}: Python {sys.version.split()[0]}, "
  f"torch {torch.__version__}, transformers {transformers.__version__}")' "$cell"
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(datasets|evaluate) " || true
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
status=0
if [ ${#units[@]} -gt 0 ]; then
  "$venv/bin/python" -m pytest -p no:cacheprovider "${units[@]}" "$@" || status=$?
fi
"$venv/bin/python" -m pytest -p no:cacheprovider "${tests[@]}" "$@" || status=$?
exit $status
