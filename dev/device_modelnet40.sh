#!/usr/bin/env bash
# ModelNet40 recipes of experiments/modelnet40.py (issue 27) on the lent GPU. A run outlives
# one device call (10 minutes), so it trains in its own process session, which lives on
# between calls while the machine is held, with a checkpoint after every epoch:
#   bash dev/device_modelnet40.sh start     # last call of a lease (dev/device_parts.sh, with
#                                            # DEVPARTS_DATA=modelnet40_train.npz)
#   bash dev/device_modelnet40.sh collect   # repeat until every run is in $OUT/results.tar
#   MODELS="RECIPE ..." bash dev/device_modelnet40.sh models   # the chosen runs' model.keras
# FINALS="RECIPE[:GPU] ..." beside RUNS also starts `--final RECIPE` (the recipe on every
# training shape, logged and collected as RECIPE-final).
# start unpacks TensorFlow-GPU, copies this checkout to /tmp/repo and starts every recipe
# of RUNS (default "octnet3-32 site-resnet-32"; RECIPE:GPU pins one to a GPU, the others go
# round the machine's GPUs) side by side, each as `experiments/modelnet40.py --run RECIPE
# $EXTRA` (EXTRA: further options, e.g. --epochs 60); collect waits up to WAIT seconds
# (default 500), prints each run's newest epoch line, and puts every finished run's
# results.json, split.json, training_curve.png and log into $OUT/results.tar; models
# returns model.keras of the recipes in MODELS in 15 MB pieces.
# A lease is held for 30 minutes at most. To go on in the next one, collect with
# BACKUP_OUT=1 before it ends: each run's checkpoint folder (weights and Adam's moments,
# ~30 MB at 32^3) comes back as $OUT/backup-RECIPE.tar.aa, .ab, ... (15 MB pieces; the
# device returns 8 files, 64 MB a call: give RUNS=one recipe where two do not fit). Here,
# put the pieces into .mn40_backup/ (ignored by git); in the next lease, before start,
# carry them in one call per recipe:
#   command: mkdir -p /tmp/mn40_backup && cat .mn40_backup/backup-RECIPE.tar.* | tar -C /tmp/mn40_backup -xf -
#   carry:   [".mn40_backup"]
# and start as before: the runs continue from their last finished epoch (the same
# arguments, or train refuses the checkpoint).
# Back here: tar -xf results.tar, cat model-RECIPE.keras.* > RECIPE/model.keras, then
# python experiments/modelnet40.py --add-results RECIPE RECIPE/results.json --keep-models DIR
# --note "..." and python experiments/summarize.py.
set -uo pipefail
RUNS=${RUNS-octnet3-32 site-resnet-32}  # RUNS="" with FINALS: finals only
WAIT=${WAIT:-500}
EXTRA=${EXTRA:-}
BACKUP=/tmp/mn40_backup
case "${1:-}" in
  start)
    # (unpacked already where an earlier command of this lease ran dev/device_unpack.sh)
    [ -f /tmp/tfgpu.env ] || bash dev/device_unpack.sh > /tmp/unpack.log 2>&1 || { tail -30 /tmp/unpack.log; exit 1; }
    . /tmp/tfgpu.env
    mkdir -p "$BACKUP"
    rm -rf /tmp/repo && cp -a . /tmp/repo && cd /tmp/repo
    gpus=$(nvidia-smi -L | wc -l)
    i=0
    for run in $RUNS ${FINALS:+$(for f in $FINALS; do echo "final/$f"; done)}; do
      how=--run
      case "$run" in final/*) how=--final; run=${run#final/} ;; esac
      name=${run%%:*}
      log=$name; [ "$how" = --run ] || log=$name-final
      gpu=$(( i % gpus )); [ "$run" = "$name" ] || gpu=${run#*:}
      i=$(( i + 1 ))
      [ ! -d "$BACKUP/$log" ] || echo "$log: resuming from $(wc -l < "$BACKUP/$log/epochs.jsonl") epoch(s)"
      echo "$log: GPU $gpu"
      # --no-record: the runs finish at different times and would each rewrite modelnet40.json;
      # the rows are added here from their results.json (--add-results).
      # shellcheck disable=SC2086  # EXTRA is a list of options
      CUDA_VISIBLE_DEVICES=$gpu TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1 setsid nohup python3 \
        experiments/modelnet40.py $how "$name" $EXTRA --data-dir .devdata --out-root /tmp/mn40_runs \
        --backup-root "$BACKUP" --no-record > "/tmp/mn40_$log.log" 2>&1 < /dev/null &
    done
    sleep "${WATCH:-420}"
    for log in /tmp/mn40_*.log; do echo "$log: $(grep '^epoch ' "$log" | tail -1)"; done
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
    ;;
  collect)
    cd /tmp/repo
    t0=$(date +%s)
    # wait for the runs named (RUNS, FINALS), not for others still training beside them
    pattern="experiments/modelnet40.py --(run|final) ($(for run in $RUNS ${FINALS:-}; do printf '%s|' "${run%%:*}"; done | sed 's/|$//')) "
    while pgrep -f "$pattern" > /dev/null && [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do
      sleep 10
    done
    finished=()
    for run in $RUNS ${FINALS:+$(for f in $FINALS; do echo "${f%%:*}-final"; done)}; do
      name=${run%%:*}
      echo "$name: $(grep '^epoch ' "/tmp/mn40_$name.log" | tail -1)"
      grep -E "Traceback|[A-Za-z]+Error:" "/tmp/mn40_$name.log" | tail -3
      if [ "${BACKUP_OUT:-0}" = 1 ]; then
        tar -C "$BACKUP" -cf - "$name" | split -b 15000000 - "$OUT/backup-$name.tar."
      elif grep -q "=== $name finished" "/tmp/mn40_$name.log"; then
        cp "/tmp/mn40_$name.log" "/tmp/mn40_runs/$name/train.log"
        finished+=("$name/results.json" "$name/split.json" "$name/training_curve.png" "$name/train.log")
      else
        echo "$name: NOT FINISHED (still training or voting after ${WAIT} s): not in results.tar; collect it again"
      fi
    done
    # The scores of every finished run in one file; their models with `models`.
    [ ${#finished[@]} = 0 ] || tar -C /tmp/mn40_runs -cf "$OUT/results.tar" "${finished[@]}"
    ls -la "$OUT"
    ;;
  models)
    # $MODELS (recipe names): their model.keras in 15 MB pieces, $OUT/model-RECIPE.keras.aa, .ab, ...
    # (the device returns 8 files, 16 MB each, a call); here: cat model-RECIPE.keras.* > model.keras
    for name in $MODELS; do split -b 15000000 "/tmp/mn40_runs/$name/model.keras" "$OUT/model-$name.keras."; done
    ls -la "$OUT"
    ;;
  *) echo "usage: $0 start|collect|models" >&2; exit 2 ;;
esac
