#!/usr/bin/env bash
# The main job, from a fresh clone: sets up .venv, builds, runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python -m tf_sparseconv.channel.demo "$@"
