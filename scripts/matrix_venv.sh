#!/usr/bin/env bash
# Create (or reuse) the virtualenv of one CI matrix cell: a given Python, the pinned packages (torch,
# transformers, ...), the project's other dependencies at whatever the resolver picks within pyproject.toml's
# ranges, and what the tests need (pytest, psutil for the memory metrics).
#   usage: scripts/matrix_venv.sh VENV PYTHON SPEC [SPEC...]      e.g. torch==2.11.0 transformers==5.17.0
# The project itself is resolved with them (a pin outside its declared ranges fails here), then uninstalled:
# the tests import trainkit from the checkout (pytest's pythonpath, the workers' PYTHONPATH), so one venv
# serves every checkout and survives between CI runs.
# Idempotent: a stamp (hash of pyproject.toml, this script and the specs) skips the install when nothing changed.
# torch other than the local CPU wheel comes from the registry as a CUDA build; it runs on CPU all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
  echo "usage: $0 VENV PYTHON SPEC [SPEC...]" >&2
  exit 2
fi
VENV=$1 PYTHON=$2
shift 2
stamp="$VENV/.trainkit-matrix-installed"
want="$(cat pyproject.toml scripts/matrix_venv.sh | sha256sum | cut -c1-16) $PYTHON $*"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x "$PYTHON" ]; then
  echo "[matrix_venv] no interpreter $PYTHON" >&2
  exit 3
fi
echo "[matrix_venv] creating $VENV ($PYTHON $*)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "$@" ".[recipes]" "pytest>=8" "pytest-timeout>=2.3" psutil 2>&1 \
  | { grep -v "^WARNING: Location" || true; } >&2
"${pip[@]}" uninstall -y trainkit
echo "$want" > "$stamp"
