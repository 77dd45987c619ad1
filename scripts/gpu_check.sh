#!/usr/bin/env bash
# The checks that need a CUDA device, as one script for a GPU machine (README "Tests" and "Benchmarks").
#
#   bash scripts/gpu_check.sh [STAGE ...]     stages: tests suite accuracy tests+accuracy scripts overhead watch scale
#                                             (default: tests+accuracy overhead watch scale)
#
# Each stage runs under its own time limit and writes STAGE.log (and STAGE.json where it has one) into
# $OUT (default ./gpu-out); summary.txt gets one "rc N STAGE seconds" line a stage. Where nnwizard is
# not importable and a folder .whl/ holds wheels (nnwizard's own, `pip wheel --no-deps -w .whl .`, and
# each dependency the machine lacks), they are installed into /tmp/site first, with no index.
set -u
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! "$PY" -c "import nnwizard" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
{ nvidia-smi -L; "$PY" -c "import torch, nnwizard; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'nnwizard', nnwizard.__version__)"; } 2>&1 | tee "$OUT/env.txt"

stage() {  # stage NAME SECONDS CMD...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit} s)"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "rc $rc $name $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 4 "$OUT/$name.log"
}

CUDA_TESTS="tests/test_gpu.py tests/test_crash.py::test_real_cuda_device_mismatch
  tests/test_determinism.py::test_cuda_lists_nondeterministic_ops tests/test_loader.py tests/test_memory.py::test_cuda_memory_recorded
  tests/test_numerics.py::test_amp_overflow_diagnosis_on_cuda"
STAGES=${*:-tests+accuracy overhead watch scale}
for s in $STAGES; do
  case $s in
    tests) stage tests 240 "$PY" -m pytest -q -vv -p no:cacheprovider -rs -n 4 $CUDA_TESTS ;;
    # the whole default suite with a CUDA device visible (`--device auto` takes it); the wheel test needs an index
    suite) stage suite 240 "$PY" -m pytest -q -p no:cacheprovider -n 12 --ignore=tests/test_wheel.py ;;
    accuracy) stage accuracy 240 "$PY" benchmarks/accuracy.py --device cuda --jobs 6 --json "$OUT/accuracy.json" ;;
    # correctness only (their seconds are not quoted): both at once, on 16 cores and one GPU
    tests+accuracy) bash "$0" tests & bash "$0" accuracy & wait ;;
    scripts) stage scripts 200 "$PY" benchmarks/accuracy.py --scripts --device cuda ;;
    overhead) stage overhead 120 "$PY" benchmarks/recorder_overhead.py --device cuda --repeats 5 --steps 300 --big-steps 100 ;;
    watch) stage watch 120 "$PY" benchmarks/watch_overhead.py --device cuda --only overhead --repeats 15 --markdown ;;
    scale) stage scale 300 "$PY" benchmarks/scale.py --device cuda --only cnn_w128 gpt_d768_l12 --json "$OUT/scale.json" ;;
    *) echo "unknown stage $s" ;;
  esac
done
