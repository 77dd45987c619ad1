#!/usr/bin/env bash
# Install nnwizard and diagnose a bundled broken example (a train_step that never calls
# optimizer.step()), writing reports/demo.md (with plots) and reports/demo.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh examples
# shellcheck disable=SC1091
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
mkdir -p reports
nnwizard diagnose --module examples/broken_no_step.py --non-interactive --symptom flat \
  --report reports/demo.md --json reports/demo.json "$@"
