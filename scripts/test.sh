#!/usr/bin/env bash
# The full test suite, from a fresh clone: sets up .venv (scripts/setup_env.sh: TensorFlow,
# the package installed editable, the op library built), then runs pytest with the arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python -m pytest "$@"
