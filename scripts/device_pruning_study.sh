#!/usr/bin/env bash
# The Fig. 6 study on the lent GPU (experiments/README.md; the runs of 2026-11-24 used these
# steps as two ad hoc scripts; this script then ran a 2-epoch, 400-shape check on an H200). A study
# outlives one device call (10 minutes), so it runs in its own process session, which lives
# on between calls while the machine is held:
#   bash scripts/device_pruning_study.sh start     # last call of a lease (scripts/device_parts.sh,
#                                                  # with DEVPARTS_DATA=modelnet40_train.npz)
#   bash scripts/device_pruning_study.sh collect   # repeat until it lists the results in $OUT
# start unpacks TensorFlow-GPU, copies this checkout to /tmp/repo and trains every
# configuration side by side on the GPU; collect waits for it, then re-times the saved
# models on 4 of the host's cores with the GPU hidden, and copies the results and each
# run's results.json to $OUT (models are ~100 MB each and stay behind).
# STUDY_ARGS: the study's options; RESULTS_NAME: its results file; RETIME_EPOCHS: which
# epochs' models to re-time (snapshots of --snapshot-epochs, or the last); RETIME_GPU=1:
# re-time them on the GPU too. The two runs of experiments/README.md:
#   RETIME_GPU=1 (defaults otherwise)
#   STUDY_ARGS="--lambdas 0 0.3 --prune-eps 0.005 0.002 0.001 --snapshot-epochs 1 10" RESULTS_NAME=pruning_thresholds
set -uo pipefail
STUDY_ARGS=${STUDY_ARGS:---lambdas 0 0.1 0.2 0.3 --prune-eps 0.01 --snapshot-epochs 1 5 10 20}
RESULTS_NAME=${RESULTS_NAME:-pruning}
RETIME_EPOCHS=${RETIME_EPOCHS:-1 10 30}
EPOCHS=${EPOCHS:-30}
case "${1:-}" in
  start)
    bash scripts/device_unpack.sh > /tmp/unpack.log 2>&1 || { tail -30 /tmp/unpack.log; exit 1; }
    . /tmp/tfgpu.env
    rm -rf /tmp/repo /tmp/retime.started && cp -a . /tmp/repo && cd /tmp/repo
    TF_FORCE_GPU_ALLOW_GROWTH=true setsid nohup python3 experiments/pruning.py --resolution 16 --epochs "$EPOCHS" \
      --lr-schedule cosine --parallel $STUDY_ARGS --results-name "$RESULTS_NAME" --data-dir .devdata \
      --work-dir /tmp/prun --retime-repeats 0 > /tmp/pruning.log 2>&1 < /dev/null &
    sleep "${WATCH:-480}"
    grep "===" /tmp/pruning.log | tail -4 | cut -c1-200
    ;;
  collect)
    cd /tmp/repo && . /tmp/tfgpu.env
    t0=$(date +%s)
    while pgrep -f "pruning.py --resolution 16 --epochs $EPOCHS --lr-schedule" > /dev/null \
        && [ $(( $(date +%s) - t0 )) -lt 500 ]; do sleep 10; done
    grep "===" /tmp/pruning.log | tail -5 | cut -c1-200
    if grep -q "wrote .*$RESULTS_NAME.json" /tmp/pruning.log && [ ! -e /tmp/retime.started ]; then
      touch /tmp/retime.started
      retime="python3 experiments/pruning.py --resolution 16 --epochs $EPOCHS --retime-only \
        --results-name $RESULTS_NAME --work-dir /tmp/prun --data-dir .devdata --retime-epochs $RETIME_EPOCHS \
        --retime-repeats 2"
      # First alone on the GPU with all shapes (RETIME_GPU=1), then on 4 host cores with the GPU hidden.
      setsid nohup bash -c "{ [ '${RETIME_GPU:-0}' != 1 ] || $retime; } && \
        CUDA_VISIBLE_DEVICES='' taskset -c 0-3 $retime --retime-max-examples 2000" \
        > /tmp/cpu_retime.log 2>&1 < /dev/null &
    fi
    while [ -e /tmp/retime.started ] && ! grep -q "CPU ([0-9]* cores):" /tmp/cpu_retime.log \
        && [ $(( $(date +%s) - t0 )) -lt 560 ]; do sleep 10; done
    grep "===\|λ\|Error" /tmp/cpu_retime.log 2>/dev/null | tail -30
    if grep -q "CPU ([0-9]* cores):" /tmp/cpu_retime.log 2>/dev/null; then
      cp "experiments/results/$RESULTS_NAME.json" "experiments/results/$RESULTS_NAME.png" /tmp/cpu_retime.log "$OUT/"
      for r in /tmp/prun/*/results.json; do cp "$r" "$OUT/results_$(basename "$(dirname "$r")").json"; done
      cp /tmp/pruning.log "$OUT/"
    fi
    ls "$OUT"
    ;;
  *) echo "usage: $0 start|collect" >&2; exit 2 ;;
esac
