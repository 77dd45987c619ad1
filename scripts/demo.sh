#!/usr/bin/env bash
# Install nnwizard and diagnose two bundled broken examples: a training module whose train_step
# never calls optimizer.step() (reports/demo.md, reports/demo.json), and, in script mode, an
# unmodified pytorch/examples-style train.py that never calls zero_grad() (reports/demo-script.md,
# reports/demo-script.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh examples
# shellcheck disable=SC1091
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
mkdir -p reports
nnwizard diagnose --module examples/broken_no_step.py --non-interactive --symptom flat \
  --report reports/demo.md --json reports/demo.json "$@"
nnwizard diagnose --script examples/scripts/broken_mnist_style_missing_zero_grad.py --non-interactive \
  --symptom oscillating --report reports/demo-script.md --json reports/demo-script.json "$@"
