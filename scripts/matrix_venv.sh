#!/usr/bin/env bash
# Create (or reuse) the virtualenv of one CI matrix cell: a given Python, torch and transformers, the project's
# other dependencies at whatever the resolver picks within pyproject.toml's ranges, and pytest.
#   usage: scripts/matrix_venv.sh VENV PYTHON TORCH_SPEC TRANSFORMERS_SPEC
# Idempotent: a stamp (hash of pyproject.toml, this script and the specs) skips the install when nothing changed.
# torch other than the local CPU wheel comes from the registry as a CUDA build; it runs on CPU all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 4 ]; then
  echo "usage: $0 VENV PYTHON TORCH_SPEC TRANSFORMERS_SPEC" >&2
  exit 2
fi
VENV=$1 PYTHON=$2 TORCH_SPEC=$3 TRANSFORMERS_SPEC=$4
stamp="$VENV/.trainkit-matrix-installed"
want="$(cat pyproject.toml scripts/matrix_venv.sh | sha256sum | cut -c1-16) $PYTHON $TORCH_SPEC $TRANSFORMERS_SPEC"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x "$PYTHON" ] && ! command -v "$PYTHON" >/dev/null; then
  echo "[matrix_venv] no interpreter $PYTHON" >&2
  exit 3
fi
echo "[matrix_venv] creating $VENV ($PYTHON, $TORCH_SPEC, $TRANSFORMERS_SPEC)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# One resolve: the pinned torch and transformers with the project's declared ranges (a pin outside them fails here).
"${pip[@]}" "$TORCH_SPEC" "$TRANSFORMERS_SPEC" -e ".[recipes]" "pytest>=8" "pytest-timeout>=2.3"
echo "$want" > "$stamp"
