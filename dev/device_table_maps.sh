#!/usr/bin/env bash
# On the lent GPU, after dev/device_unpack.sh (packed with spconv's wheels) and
# `. /tmp/tfgpu.env`: the whole site networks of benchmarks/site_e2e_gpu.py with submanifold
# maps built as neighbour tables (the default) and, in the same call, as SiteKernelMap's pairs
# (TF_SPARSECONV_TABLE_MAPS=0, the baseline), alternated ROUNDS times (default 2), spconv
# 2.3.8 once; rows of both to $OUT/site_e2e_gpu.jsonl, labelled by RUN. NETWORKS, DTYPES and
# REPS as for dev/device_site_e2e.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
networks=${NETWORKS:-unet5_lidar_5cm resunet42_lidar_5cm_b1 resunet42_lidar_5cm_b2}
for round in $(seq "${ROUNDS:-2}"); do
  for tables in 0 1; do
    exchange=/tmp/site_e2e_tables$tables
    [ "$round" = 1 ] && rm -rf "$exchange"
    [ "$round" = 1 ] || exchange=${exchange}_r$round
    echo "== round $round, TF_SPARSECONV_TABLE_MAPS=$tables"
    # shellcheck disable=SC2086  # word lists on purpose
    TF_SPARSECONV_TABLE_MAPS=$tables python3 benchmarks/site_e2e_gpu.py --phase ours --networks $networks \
      --dtypes ${DTYPES:-fp16 fp32} --reps "${REPS:-20}" --exchange "$exchange" 2>&1 \
      | tee -a "$out/site_e2e_ours.log" | grep -v "^W0000\|^I0000"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "table maps: our phase failed"; exit 1; }
  done
done
(. /tmp/peers.env && python3 benchmarks/site_e2e_spconv.py --reps "${REPS:-20}" --exchange /tmp/site_e2e_tables1) 2>&1 \
  | tee "$out/site_e2e_spconv.log" | grep -v "^W0000\|^I0000"
for exchange in /tmp/site_e2e_tables*; do
  [ "$exchange" = /tmp/site_e2e_tables1 ] || cp /tmp/site_e2e_tables1/spconv.json "$exchange/"
  case "$exchange" in *tables0*) maps="pair maps (TF_SPARSECONV_TABLE_MAPS=0)" ;; *) maps="table maps" ;; esac
  python3 benchmarks/site_e2e_gpu.py --phase merge --exchange "$exchange" --out "$out/site_e2e_gpu.jsonl" \
    --kernels-out "$out/site_e2e_kernels.jsonl" --run "${RUN:-lent GPU}: $maps, ${exchange##*/}" 2>&1 \
    | grep -v "^W0000\|^I0000"
done
