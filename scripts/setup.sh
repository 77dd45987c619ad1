#!/usr/bin/env bash
# Set-up on a fresh machine: a .venv (unless a virtual environment is already active), a CPU build of
# torch only where no torch is importable, then nnwizard itself (editable) with the given extras.
#   bash scripts/setup.sh [extras]      e.g. bash scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
if ! python -c "import torch" 2>/dev/null; then
  echo "setup: no torch importable; installing the CPU build torch==2.13.0"
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[${1:-examples}]"
echo "setup: $(nnwizard --version) in $(dirname "$(dirname "$(command -v python)")")"
