#!/usr/bin/env bash
# Creates the virtual environment (.venv), installs TensorFlow and the requirements, and
# builds the op library when it is missing or older than its sources. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
TF_PACKAGE="${TF_PACKAGE:-tensorflow-cpu==2.21.*}"

if [ ! -x .venv/bin/python ]; then
  PYTHON=""
  for candidate in python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))'; then
      PYTHON="$candidate"; break
    fi
  done
  [ -n "$PYTHON" ] || { echo "setup_env: need Python 3.11 or 3.12 on PATH" >&2; exit 1; }
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import tensorflow' 2>/dev/null; then
  echo "[setup] installing $TF_PACKAGE (a few minutes on a fresh machine)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "$TF_PACKAGE"
fi
echo "[setup] checking requirements.txt"
.venv/bin/python -m pip install -q -r requirements.txt
lib=tf_sparseconv/_tf_sparseconv_ops.so
if [ ! -f "$lib" ] || [ ! -f tf_sparseconv/_build_info.py ] || \
   [ -n "$(find cc_ops cuda setup.py -newer "$lib" -type f 2>/dev/null | head -n 1)" ]; then
  echo "[setup] building the op library"
  .venv/bin/python setup.py -q build_ext --inplace --force  # distutils does not track headers
fi
.venv/bin/python -c 'import tf_sparseconv' 2>/dev/null || {
  echo "[setup] op library does not match this TensorFlow; rebuilding"
  .venv/bin/python setup.py -q build_ext --inplace --force
}
echo "[setup] ready: $(.venv/bin/python -c 'import tensorflow as tf; print("TensorFlow", tf.__version__)' 2>/dev/null)"
