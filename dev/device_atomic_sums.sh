#!/usr/bin/env bash
# On the lent GPU, after dev/device_unpack.sh and `. /tmp/tfgpu.env`: the direct convolution's
# dataflows in the same call. First the six-layer stack of benchmarks/direct_conv_stack_gpu.py
# with each of STACK_DATAFLOWS (default "sort auto": the sort as before, then 'auto', which takes
# the atomic sums where it took the sort), KERNELS (default 12) costliest kernels traced for
# each; then the Fig. 4 layer of benchmarks/direct_conv_gpu.py (--only-time) with each of
# FIG4_DATAFLOWS (default "bitmap atomic auto"). RESOLUTIONS (default "128 256"), DENSITIES
# (default "0.1 1.0"). Rows to $OUT/stack.jsonl and $OUT/fig4_<dataflow>.jsonl. With TRAIN=1
# (the lease packed with DEVPARTS_DATA="modelnet40_train.npz"), last the OctNet3 32³ training step
# of benchmarks/train_step.py under each of TRAIN_DATAFLOWS (default "sort auto") and one epoch
# under 'auto', rows to $OUT/train_step_gpu.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
resolutions=${RESOLUTIONS:-128 256}
densities=${DENSITIES:-0.1 1.0}
failed=0
for dataflow in ${STACK_DATAFLOWS:-sort auto}; do
  echo "== stack, dataflow $dataflow"
  # shellcheck disable=SC2086  # word lists on purpose
  python3 benchmarks/direct_conv_stack_gpu.py --resolutions $resolutions --filter-densities $densities \
    --dataflow "$dataflow" --kernels "${KERNELS:-12}" --out "$out/stack.jsonl" 2>&1 | grep -v "^W0000\|^I0000"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "stack with $dataflow failed"; failed=1; }
done
for dataflow in ${FIG4_DATAFLOWS:-bitmap atomic auto}; do
  echo "== Fig. 4 layer, dataflow $dataflow"
  # shellcheck disable=SC2086
  python3 benchmarks/direct_conv_gpu.py --only-time --time-resolutions $resolutions --dataflow "$dataflow" \
    --out "$out/fig4_$dataflow.jsonl" 2>&1 | grep -v "^W0000\|^I0000"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "Fig. 4 layer with $dataflow failed"; failed=1; }
done
if [ "${TRAIN:-0}" = 1 ]; then
  echo "== OctNet3 32^3 training step and epoch"
  # shellcheck disable=SC2086
  python3 benchmarks/train_step.py --resolutions 32 --dataflows ${TRAIN_DATAFLOWS:-sort auto} --epoch \
    --data-dir .devdata --out "$out/train_step_gpu.jsonl" 2>&1 | grep -v "^W0000\|^I0000"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "training step failed"; failed=1; }
fi
exit $failed
