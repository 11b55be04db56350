#!/usr/bin/env bash
# On a lent machine of two GPUs, after dev/device_unpack.sh and `. /tmp/tfgpu.env`: issue 26's
# ModelNet40 32^3 epoch, one replica and two (the same batch per replica), under each of
# TensorFlow's GPU thread modes in turn, so each mode's scaling comes from rows of one call.
#   MODES     (default "global gpu_private"): TF_GPU_THREAD_MODE per round; "global" leaves it unset
#   BATCH     (default 32): shapes per replica
#   STRATEGIES (default "mirrored"): the two-replica strategies (mirrored, multi-worker)
#   REPLICAS  (default "1 2"), EPOCHS (default 3), TRAIN_TIMEOUT (s per configuration, default 240)
# Rows to $OUT/distributed.jsonl (each with its gpu_thread_mode), the output to $OUT/thread_modes.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true NCCL_NVLS_ENABLE=0
nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
[ -n "$nccl" ] && mkdir -p /tmp/cu12 && ln -sf "$nccl" /tmp/cu12/libnccl.so.2
out=${OUT:-/tmp/out}
mkdir -p "$out"
started=$SECONDS
for mode in ${MODES:-global gpu_private}; do
  if [ "$mode" = global ]; then unset TF_GPU_THREAD_MODE; else export TF_GPU_THREAD_MODE=$mode; fi
  echo "== TF_GPU_THREAD_MODE=${TF_GPU_THREAD_MODE:-unset}, ${BATCH:-32} shapes per replica"
  # shellcheck disable=SC2086
  python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas ${REPLICAS:-1 2} --scalings weak \
    --batch-size "${BATCH:-32}" --strategies ${STRATEGIES:-mirrored} --data-dir .devdata --epochs "${EPOCHS:-3}" \
    --timeout "${TRAIN_TIMEOUT:-240}" --out "$out/distributed.jsonl" 2>&1 | grep -v "^[IW]0000" \
    | tee -a "$out/thread_modes.log"
  echo "$mode done at $((SECONDS - started)) s"
done
