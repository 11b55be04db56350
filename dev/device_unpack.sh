#!/usr/bin/env bash
# On the lent GPU, in the last call of a lease (see dev/device_parts.sh): joins the
# pieces copied to /tmp/blob by the earlier calls and the one carried now, unpacks
# TensorFlow-GPU (then `. /tmp/tfgpu.env`), spconv where it was packed (`. /tmp/peers.env`),
# puts the packed op library into tf_sparseconv/ and the LiDAR frame into .devdata/, and
# hypothesis (the fuzz tests') beside TensorFlow in /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/blob
cp .devparts/c*/blob.* /tmp/blob/
cat /tmp/blob/blob.* | tar -xf - -C /tmp
cp /tmp/devpack/lib/_tf_sparseconv_ops.so /tmp/devpack/lib/_build_info.py tf_sparseconv/
if [ -d /tmp/devpack/data ]; then mkdir -p .devdata && cp /tmp/devpack/data/* .devdata/; fi
bash /tmp/devpack/setup-on-device.sh
cp -r /tmp/devpack/pylib/. /tmp/site/  # hypothesis for the fuzz tests, beside TensorFlow
if [ -d /tmp/peerparts ]; then bash /tmp/devpack/install-on-device.sh; fi
# The packed commit for the benchmarks' rows (benchmarks/run_info.py), with TensorFlow's env.
if [ -f /tmp/devpack/commit ]; then echo "export BENCHMARK_COMMIT=$(cat /tmp/devpack/commit)" >> /tmp/tfgpu.env; fi
