#!/usr/bin/env bash
# On a lent machine of two GPUs (nvidia-h100-x2 / nvidia-h200-x2), after dev/device_unpack.sh
# and `. /tmp/tfgpu.env` (DEVPARTS_DATA="modelnet40_train.npz lidar_scan.npz" when packing):
# issue 26's scaling rows and issue 25's GPU fuzz under compute-sanitizer, in one call.
#   1. one replica of the ModelNet40 32^3 trainer on GPU 0, while the fuzz modules' GPU
#      cases run under memcheck on GPU 1 (they share no GPU);
#   2. two replicas of the trainer (same global batch, then same batch per replica), as one
#      worker process per GPU (multi-worker, over NCCL) and as one process (mirrored);
#   3. the site UNet step on the LiDAR frame, one and two replicas;
#   4. (PROFILE=1, the default) benchmarks/step_profile.py: one and two mirrored replicas (each with
#      Keras' Adam and with the trainer's FusedAdam) of the
#      OctNet3 step under TensorFlow's profiler, rows to $OUT/step_profile.jsonl, the traces in
#      $OUT/traces.tar.gz where they fit in one returned file (15 MB).
# Rows to $OUT/distributed.jsonl, the fuzz outcomes to $OUT/fuzz_gpu_{channel,site}.json, logs beside them,
# each two-replica trainer process's output (NCCL_DEBUG=INFO) in $OUT/trainer_logs.tar.gz.
# EPOCHS (default 3), FUZZ_EXAMPLES (default 8), FUZZ_TIMEOUT (s, default 130) and TRAIN_TIMEOUT (s per
# trainer configuration, default 240) tune the call's length; FUZZ=0 leaves the fuzz out; BEFORE=1 also
# runs the one-replica epoch with TF_SPARSECONV_CHECK_EVERY_OP=1 (every op re-checks its inputs);
# BIG_BATCH=1 also runs one replica at 64 shapes and two at 64 each (after the profile): the
# scaling where a replica's batch outweighs the step's fixed costs. STRATEGIES (default
# "multi-worker mirrored") and SCALINGS (default "strong weak") choose the two-replica runs,
# GRADIENT_ALL_REDUCES (e.g. "packed per-gradient") runs each two-replica configuration with each
# --gradient-all-reduce, TRAIN_ARGS is passed to every trainer (e.g. "--steps-per-execution 4"), SITE_BATCH_NORMS
# (default "synchronized keras-synchronized local") the site UNet's batch norms, SITE=0 leaves
# the site UNet out and MODELNET=0 the trainer.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true NCCL_NVLS_ENABLE=0
# TensorFlow loads NCCL (MirroredStrategy's all-reduce) as libnccl.so.2 at run time; the
# bundle has none, the machine's PyTorch does: put it where /tmp/tfgpu.env's path looks.
nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
[ -n "$nccl" ] && mkdir -p /tmp/cu12 && ln -sf "$nccl" /tmp/cu12/libnccl.so.2
echo "NCCL: ${nccl:-none found}"
epochs=${EPOCHS:-3}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi -L
started=$SECONDS

# The fuzz modules side by side on GPU 1, each under memcheck with its own report (FUZZ=0: none).
[ "${FUZZ:-1}" = 0 ] && families="" || families="channel site"
for family in $families; do
  CUDA_VISIBLE_DEVICES=1 timeout "${FUZZ_TIMEOUT:-130}" compute-sanitizer --tool memcheck \
    --target-processes all --log-file "$out/memcheck_$family.log" python3 -m pytest -q -p no:randomly \
    -p no:cacheprovider "tests/$family/test_fuzz.py" -m gpu --fuzz-examples "${FUZZ_EXAMPLES:-8}" \
    --fuzz-report "$out/fuzz_gpu_$family.json" > "$out/fuzz_gpu_$family.log" 2>&1 &
done

# shellcheck disable=SC2206  # word lists on purpose
train_args=(${TRAIN_ARGS:-})
[ ${#train_args[@]} -gt 0 ] && train_args=(--train-args "${train_args[@]}")
if [ "${MODELNET:-1}" = 1 ]; then
  python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas 1 --data-dir .devdata \
    --epochs "$epochs" --out "$out/distributed.jsonl" "${train_args[@]}" 2>&1 | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  echo "one replica done at $((SECONDS - started)) s"
fi
if [ "${BEFORE:-0}" = 1 ]; then
  # The same run with every op re-checking its inputs (the waits before issue 24's first step).
  TF_SPARSECONV_CHECK_EVERY_OP=1 python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas 1 \
    --data-dir .devdata --epochs "$epochs" --out "$out/distributed.jsonl" 2>&1 | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  echo "one replica, every op checked, done at $((SECONDS - started)) s"
fi
wait; echo "fuzz under memcheck done at $((SECONDS - started)) s"
for family in $families; do
  tail -2 "$out/fuzz_gpu_$family.log"; grep -h "ERROR SUMMARY" "$out/memcheck_$family.log" | sort | uniq -c
done

# Each trainer process's output (with NCCL's own report of its communicators) to $out/logs.
if [ "${MODELNET:-1}" = 1 ]; then
  # shellcheck disable=SC2086  # word lists on purpose
  NCCL_DEBUG=INFO python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas 2 --data-dir .devdata \
    --strategies ${STRATEGIES:-multi-worker mirrored} --scalings ${SCALINGS:-strong weak} --epochs "$epochs" \
    ${GRADIENT_ALL_REDUCES:+--gradient-all-reduces $GRADIENT_ALL_REDUCES} \
    --timeout "${TRAIN_TIMEOUT:-240}" --logs "$out/logs" --out "$out/distributed.jsonl" "${train_args[@]}" 2>&1 \
    | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  grep -c "NCCL INFO" "$out"/logs/*.log
  # one file back (a call returns 8 at most)
  tar -czf "$out/trainer_logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
  echo "two replicas done at $((SECONDS - started)) s"
fi
if [ "${SITE:-1}" = 1 ]; then
  # shellcheck disable=SC2086  # word lists on purpose
  python3 benchmarks/distributed.py --workloads site_unet_lidar_step --replicas 1 2 --steps 5 --warmup 2 \
    ${GRADIENT_ALL_REDUCES:+--gradient-all-reduces $GRADIENT_ALL_REDUCES} \
    --batch-norms ${SITE_BATCH_NORMS:-synchronized keras-synchronized local} --out "$out/distributed.jsonl" 2>&1 \
    | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  echo "site UNet done at $((SECONDS - started)) s"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  python3 benchmarks/step_profile.py --replicas 1 2 --optimizers keras-adam fused-adam --data-dir .devdata --keep-trace /tmp/traces \
    --out "$out/step_profile.jsonl" 2>&1 | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  tar -czf "$out/traces.tar.gz" -C /tmp traces
  [ "$(stat -c %s "$out/traces.tar.gz")" -le 15000000 ] || { echo "traces over 15 MB: not returned"; rm "$out/traces.tar.gz"; }
fi
if [ "${BIG_BATCH:-0}" = 1 ]; then
  python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas 1 --batch-size 64 --data-dir .devdata \
    --epochs "$epochs" --out "$out/distributed.jsonl" 2>&1 | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  python3 benchmarks/distributed.py --workloads modelnet40_32_epoch --replicas 2 --batch-size 64 --scalings weak \
    ${GRADIENT_ALL_REDUCES:+--gradient-all-reduces $GRADIENT_ALL_REDUCES} --data-dir .devdata --strategies mirrored \
    --epochs "$epochs" --timeout "${TRAIN_TIMEOUT:-240}" \
    --out "$out/distributed.jsonl" 2>&1 | grep -v "^[IW]0000" | tee -a "$out/scaling.log"
  echo "64 per replica done at $((SECONDS - started)) s"
fi
echo "all done at $((SECONDS - started)) s"
