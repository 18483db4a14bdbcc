#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv with everything the tests and recipes need.
# torch is pinned first: an unpinned torch would pull gigabytes of CUDA packages on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${TRAINKIT_VENV:-.venv}
TORCH_SPEC=${TRAINKIT_TORCH_SPEC:-torch==2.13.0}
stamp="$VENV/.trainkit-installed"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[bootstrap] creating $VENV (torch: $TORCH_SPEC)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev,recipes,test]"
echo "$want" > "$stamp"
