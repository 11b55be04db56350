#!/usr/bin/env bash
# On the lent GPU, after dev/device_unpack.sh (packed with spconv's wheels, .peers/) and
# `. /tmp/tfgpu.env`: issue 24's whole site networks against spconv 2.3.8
# (benchmarks/site_e2e_gpu.py's three phases), rows to $OUT/site_e2e_gpu.jsonl, each
# phase's log beside them. NETWORKS (default all three), DTYPES (default "fp32 fp16") and
# REPS (default 20) tune the call's length; CPU_CHECK=1 also makes our fp32 reference on the
# CPU and reports the GPU's distance from it; RECORD_MISMATCH=1 times spconv on a network
# that differs from ours too (rows carry the error) instead of stopping; KERNELS=N also traces
# each pass on both sides and gives the GPU's busy time and N costliest kernels
# ($OUT/site_e2e_kernels.jsonl); COORDS_DTYPE=int32 feeds our side int32 coordinates
# (copied to the GPU in every call) instead of int64; BN="fused block" times our networks
# with each batch-norm layer choice of site_e2e_gpu.py --bn (default fused).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
exchange=/tmp/site_e2e
rm -rf "$exchange"
networks=${NETWORKS:-unet5_lidar_5cm resunet42_lidar_5cm_b1 resunet42_lidar_5cm_b2}
# shellcheck disable=SC2086  # word lists on purpose
python3 benchmarks/site_e2e_gpu.py --phase ours --networks $networks --dtypes ${DTYPES:-fp32 fp16} \
  --reps "${REPS:-20}" --exchange "$exchange" --coords-dtype "${COORDS_DTYPE:-int64}" --bn ${BN:-fused} ${CPU_CHECK:+--cpu-check} ${KERNELS:+--kernels "$KERNELS"} 2>&1 | tee "$out/site_e2e_ours.log" | grep -v "^W0000\|^I0000"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "site_e2e: our phase failed"; exit 1; }
(. /tmp/peers.env && python3 benchmarks/site_e2e_spconv.py --reps "${REPS:-20}" --exchange "$exchange" \
  ${RECORD_MISMATCH:+--record-mismatch} ${KERNELS:+--kernels "$KERNELS"}) 2>&1 \
  | tee "$out/site_e2e_spconv.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "site_e2e: spconv's phase failed"; exit 1; }
python3 benchmarks/site_e2e_gpu.py --phase merge --exchange "$exchange" --out "$out/site_e2e_gpu.jsonl" \
  --kernels-out "$out/site_e2e_kernels.jsonl" \
  --run "${RUN:-lent GPU}" 2>&1 | grep -v "^W0000\|^I0000"
