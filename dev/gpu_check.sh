#!/usr/bin/env bash
# GPU check, on a machine with an NVIDIA GPU and TensorFlow importable by `python3` (e.g.
# from PYTHONPATH=/tmp/site; no virtual environment is created):
#   build      builds the op library with CUDA for sm_90 only (TF_SPARSECONV_CUDA_ARCHS overrides)
#   test       runs the whole test suite with the GPU visible: the GPU cases (the gpu case of
#              tests/conftest.py's device fixture, and the tests of its gpu fixture) then run;
#              TEST_WORKERS pytest-xdist workers (default 12, 0: one process), TEST_ARGS more
#              pytest options (e.g. --ignore=tests/test_install.py where the package is not
#              pip-installed)
#   memcheck   the channel family's GPU cases (pytest tests/channel -m gpu) under
#              compute-sanitizer --tool memcheck
#   racecheck  the same under compute-sanitizer --tool racecheck
# Usage: dev/gpu_check.sh [STAGE...]   (default: all four, in that order)
# SANITIZER_PYTEST_ARGS: pytest options for the sanitized run (default: "-x -q"; split on
# spaces); SANITIZER_K: a -k expression, passed as one argument (e.g. "not large"; racecheck's
# default: "not numerical_jacobian").
# Logs go to ${OUT:-/tmp}/; exits non-zero if any stage fails or a sanitizer reports an error.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-/tmp}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export TF_SPARSECONV_CUDA_ARCHS="${TF_SPARSECONV_CUDA_ARCHS:-90}"
PYTHON="${PYTHON:-python3}"
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(build test memcheck racecheck)
SANITIZER="$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")"
declare -a SUMMARY=()
FAILED=0

record() {  # record NAME RC SECONDS LOG
  local verdict=PASS
  [ "$2" -eq 0 ] || { verdict="FAIL (exit $2)"; FAILED=1; }
  SUMMARY+=("$(printf '%-12s %-16s %5ds  %s' "$1" "$verdict" "$3" "$4")")
}

logged() {  # logged LOG COMMAND...: the command's exit status, its output also in LOG
  local log="$1"; shift
  "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

echo "=== environment"
"$PYTHON" --version
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
command -v nvcc && nvcc --version | tail -n 2
"$PYTHON" -c 'import tensorflow as tf; print("TensorFlow", tf.__version__, tf.config.list_physical_devices("GPU"))'

gpu_ready() {
  "$PYTHON" - <<'PY'
import sys
import tensorflow as tf
from tf_sparseconv import _build_info
if not _build_info.CUDA:
    sys.exit("the op library has no GPU kernels (CUDA = False in tf_sparseconv/_build_info.py)")
if not tf.config.list_physical_devices("GPU"):
    sys.exit("TensorFlow sees no GPU: the tests' GPU cases would be skipped")
print("op library with GPU kernels for sm_" + ", sm_".join(_build_info.CUDA_ARCHS) +
      f" (nvcc {_build_info.CUDA_VERSION}); TensorFlow sees {tf.config.list_physical_devices('GPU')}")
PY
}

for stage in "${STAGES[@]}"; do
  started=$SECONDS
  case "$stage" in
    build)
      log="$LOGS/build.log"
      echo "=== build: CUDA sm_$TF_SPARSECONV_CUDA_ARCHS"
      logged "$log" "$PYTHON" setup.py build_ext --inplace --force && gpu_ready
      ;;
    test)
      log="$LOGS/pytest_all.log"
      # With pytest-xdist, TEST_WORKERS processes share the GPU (memory allocated as it
      # grows): the whole suite took 4 min 54 s with 12 on a lent H200 (2026-11-30).
      workers=()
      if [ "${TEST_WORKERS:-12}" != 0 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
        workers=(-n "${TEST_WORKERS:-12}")
      fi
      echo "=== test: the whole suite, GPU visible ${workers[*]}"
      # shellcheck disable=SC2086
      gpu_ready && logged "$log" env TF_FORCE_GPU_ALLOW_GROWTH=true "$PYTHON" -m pytest -q -rfEs -p no:cacheprovider \
          "${workers[@]}" ${TEST_ARGS:-}
      ;;
    memcheck|racecheck)
      log="$LOGS/sanitizer_$stage.log"
      echo "=== $stage: tests/channel -m gpu under compute-sanitizer"
      # TensorFlow's default allocator carves tensors out of one big block, which hides
      # out-of-bounds accesses from memcheck; cudaMallocAsync gives every tensor its own.
      # shellcheck disable=SC2086
      k_args=()
      # Racecheck slows the float64 numerical-Jacobian tests (two op calls per input
      # element) past any sensible limit; their kernels run in the other gradient tests.
      default_k=""
      [ "$stage" = racecheck ] && default_k="not numerical_jacobian"
      k="${SANITIZER_K:-$default_k}"
      [ -n "$k" ] && k_args=(-k "$k")
      gpu_ready && logged "$log" env TF_GPU_ALLOCATOR=cuda_malloc_async \
          "$SANITIZER" --tool "$stage" --target-processes all --error-exitcode 99 --print-limit 100 \
          "$PYTHON" -m pytest tests/channel -m gpu ${SANITIZER_PYTEST_ARGS:--x -q} "${k_args[@]}" -p no:cacheprovider
      rc=$?
      if [ -f "$log" ]; then
        if [ $rc -eq 0 ] && grep -E "(ERROR|RACECHECK) SUMMARY: [1-9]" "$log" >/dev/null; then
          echo "compute-sanitizer $stage reported errors (see $log)"
          rc=98
        fi
        grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | sort | uniq -c
      fi
      (exit $rc)
      ;;
    *)
      echo "unknown stage '$stage' (build, test, memcheck, racecheck)"
      log="-"
      false
      ;;
  esac
  record "$stage" $? $((SECONDS - started)) "$log"
done

echo
echo "=== summary"
for line in "${SUMMARY[@]}"; do echo "$line"; done
[ $FAILED -eq 0 ] && echo "GPU check passed" || echo "GPU check FAILED"
exit $FAILED
