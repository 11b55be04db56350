#!/usr/bin/env bash
# The main job, from a fresh clone: sets up .venv, builds, trains a sparse OctNet3 on the
# built-in procedural shapes (a few minutes on 2 cores). Extra arguments go to the trainer,
# e.g. `bash scripts/train.sh --dataset modelnet40 --resolution 32 --epochs 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python -m tf_sparseconv.train --dataset synthetic --resolution 16 --epochs 8 "$@"
