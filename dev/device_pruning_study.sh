#!/usr/bin/env bash
# Fig. 6 studies on the lent GPU (experiments/README.md). A study outlives one device call
# (10 minutes), so it runs in its own process session, which lives on between calls while
# the machine is held:
#   bash dev/device_pruning_study.sh start     # last call of a lease (dev/device_parts.sh,
#                                                  # with DEVPARTS_DATA=modelnet40_train.npz)
#   bash dev/device_pruning_study.sh collect   # repeat until it lists the results in $OUT
# start unpacks TensorFlow-GPU, copies this checkout to /tmp/repo and starts every study,
# each training its configurations side by side on the GPU (all studies share it);
# collect waits for them, then re-times each study's saved models on 4 of the host's cores
# with the GPU hidden (one study after the other), and copies the results files and figures
# to $OUT (models are ~100 MB each and stay behind).
# STUDIES: "name:options;name:options..." (options of experiments/pruning.py beyond the
# common ones below); the name labels the study's log and work folder and is its results
# file (experiments/results/<name>.json) unless the options give --results-name: the seeds of
# one figure share one file. A study whose rows are in the checkout already needs --replace
# among its options. RETIME_EPOCHS: which epochs' models to re-time (snapshots of
# --snapshot-epochs, or the last); RETIME_GPU=1: re-time them on the GPU too. The runs of
# experiments/README.md (the first two with the Eq. 4 weights only, before --lam-terms, and
# as ad hoc scripts of these steps, 2026-11-24):
#   RETIME_GPU=1 STUDIES="pruning:--lambdas 0 0.1 0.2 0.3 --prune-eps 0.01 --snapshot-epochs 1 5 10 20"
#   STUDIES="pruning_thresholds:--lambdas 0 0.3 --prune-eps 0.005 0.002 0.001 --snapshot-epochs 1 10"
# and with this script as it is (Eq. 4 on weights and biases, H200, 2026-11-24):
#   RETIME_EPOCHS=30 STUDIES="pruning_biases:--lambdas 0 0.1 0.2 0.3 --prune-eps 0.01 0.03"
#     (then, on the GPU: pruning.py --retime-only ... --results-name pruning_biases --retime-epochs 30)
#   EPOCHS=60 RETIME_EPOCHS=60 RETIME_GPU=1 STUDIES="pruning_long:--lambdas 0 0.3 --prune-eps 0.01 0.03"
#   EPOCHS=90 RETIME_EPOCHS=90 STUDIES="pruning_90:--lambdas 0 0.3 --prune-eps 0.01"
#   EPOCHS=60 RETIME_EPOCHS=60 STUDIES="pruning_finetune:--lambdas 0 0.3 --prune-eps 0.03 --finetune-epochs 15 30"
#   EPOCHS=60 RETIME_EPOCHS=60 STUDIES="pruning_finetune_seed1:--lambdas 0 0.3 --prune-eps 0.03 \
#     --finetune-epochs 15 --seed 1 --results-name pruning_finetune;pruning_finetune_seed2:(the same
#     with --seed 2)"
#   EPOCHS=60 RETIME_EPOCHS=60 STUDIES="pruning_channel:--lambdas 0 0.3 --prune-eps 0.03 --lam-density channel \
#     --finetune-epochs 0 15"
# RESOLUTION (default 16) trains OctNet3 at another grid with its Table 4 bounds;
# RETIME_MAX (default 2000) caps the shapes of the CPU re-timing epoch. At 32^3 (2026-11-24):
#   RESOLUTION=32 EPOCHS=40 RETIME_EPOCHS=40 RETIME_GPU=1 RETIME_MAX=1000 \
#     STUDIES="pruning_32:--lambdas 0 0.3 --prune-eps 0.03 --finetune-epochs 10"
#   and the same as pruning_32_seed1 and pruning_32_seed2 with --seed 1 (2) --results-name pruning_32, one lease
#   each (two runs side by side: about 20 s per epoch for lambda = 0, 15 s for 0.3; the lease
#   takes ~19 minutes with both re-timings)
set -uo pipefail
STUDIES=${STUDIES:-pruning:--lambdas 0 0.1 0.2 0.3 --prune-eps 0.01 --snapshot-epochs 1 5 10 20}
RETIME_EPOCHS=${RETIME_EPOCHS:-1 10 30}
EPOCHS=${EPOCHS:-30}
RESOLUTION=${RESOLUTION:-16}
RETIME_MAX=${RETIME_MAX:-2000}
names() { tr ';' '\n' <<< "$STUDIES" | sed 's/:.*//'; }
options() { tr ';' '\n' <<< "$STUDIES" | grep "^$1:" | sed 's/^[^:]*://'; }
option() {  # option NAME FLAG DEFAULT: the value that study NAME's options give FLAG
  local words value=$3 i
  read -ra words <<< "$(options "$1")"
  for ((i = 0; i + 1 < ${#words[@]}; i++)); do [ "${words[i]}" != "$2" ] || value=${words[i + 1]}; done
  echo "$value"
}
results() { option "$1" --results-name "$1"; }
case "${1:-}" in
  start)
    bash dev/device_unpack.sh > /tmp/unpack.log 2>&1 || { tail -30 /tmp/unpack.log; exit 1; }
    . /tmp/tfgpu.env
    rm -rf /tmp/repo /tmp/retime.started && cp -a . /tmp/repo && cd /tmp/repo
    for name in $(names); do
      TF_FORCE_GPU_ALLOW_GROWTH=true setsid nohup python3 experiments/pruning.py --resolution $RESOLUTION \
        --epochs "$EPOCHS" --lr-schedule cosine --parallel $(options "$name") --results-name "$(results "$name")" \
        --data-dir .devdata --work-dir "/tmp/prun_$name" --retime-repeats 0 \
        > "/tmp/pruning_$name.log" 2>&1 < /dev/null &
    done
    sleep "${WATCH:-480}"
    for name in $(names); do grep "===" "/tmp/pruning_$name.log" | tail -3 | cut -c1-200; done
    ;;
  collect)
    cd /tmp/repo && . /tmp/tfgpu.env
    t0=$(date +%s)
    while pgrep -f "pruning.py --resolution $RESOLUTION --epochs $EPOCHS --lr-schedule" > /dev/null \
        && [ $(( $(date +%s) - t0 )) -lt 500 ]; do sleep 10; done
    for name in $(names); do grep "===" "/tmp/pruning_$name.log" | tail -3 | cut -c1-200; done
    trained=1
    for name in $(names); do grep -q "wrote .*/$(results "$name").json" "/tmp/pruning_$name.log" || trained=0; done
    if [ $trained = 1 ] && [ ! -e /tmp/retime.started ]; then
      touch /tmp/retime.started
      steps=""
      for name in $(names); do
        retime="python3 experiments/pruning.py --resolution $RESOLUTION --epochs $EPOCHS --retime-only \
          --results-name $(results "$name") --seed $(option "$name" --seed 0) --work-dir /tmp/prun_$name --data-dir .devdata \
          --retime-epochs $RETIME_EPOCHS --retime-repeats 2"
        # Alone on the GPU with all shapes (RETIME_GPU=1), then on 4 host cores with the GPU hidden.
        [ "${RETIME_GPU:-0}" != 1 ] || steps="$steps $retime &&"
        steps="$steps CUDA_VISIBLE_DEVICES='' taskset -c 0-3 $retime --retime-max-examples $RETIME_MAX &&"
      done
      setsid nohup bash -c "$steps echo all re-timed" > /tmp/cpu_retime.log 2>&1 < /dev/null &
    fi
    while [ -e /tmp/retime.started ] && ! grep -q "all re-timed" /tmp/cpu_retime.log \
        && [ $(( $(date +%s) - t0 )) -lt 560 ]; do sleep 10; done
    grep "===\|λ\|Error" /tmp/cpu_retime.log 2>/dev/null | tail -30
    if grep -q "all re-timed" /tmp/cpu_retime.log 2>/dev/null; then
      for name in $(names); do
        cp "experiments/results/$(results "$name").json" "experiments/results/$(results "$name").png" \
          "/tmp/pruning_$name.log" "$OUT/"
      done
      cp /tmp/cpu_retime.log "$OUT/"
    fi
    ls "$OUT"
    ;;
  *) echo "usage: $0 start|collect" >&2; exit 2 ;;
esac
