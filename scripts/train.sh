#!/usr/bin/env bash
# The main job, from a fresh clone: sets up .venv (scripts/setup_env.sh), then trains with
# `tf-sparseconv train`, whose defaults are the main job. Extra arguments go to the trainer,
# e.g. `bash scripts/train.sh --dataset modelnet40 --data-dir ../shared/data --epochs 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/tf-sparseconv train "$@"
