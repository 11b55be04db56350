#!/usr/bin/env bash
# On the lent GPU, after dev/device_unpack.sh and `. /tmp/tfgpu.env`: two op libraries in the
# same lease, alternated ROUNDS times (default 2): OLD_LIB (default .altlib/_tf_sparseconv_ops.so)
# and the unpacked one (tf_sparseconv/_tf_sparseconv_ops.so, "new"). Each round runs, as asked:
# with FIG4=1 (default) dev/host_time_fig4.py (the Fig. 4 layer as inside a network, ρ_f 0.1,
# RESOLUTIONS default "128 256", both selections; cuDNN's conv3d in the first round); with
# STACK=1 (default) the six-layer stack of benchmarks/direct_conv_stack_gpu.py at
# STACK_RESOLUTIONS (default 256), ρ_f 0.1; with STEP=1 (default 0) OctNet3's training step at
# STEP_RESOLUTION³ (default 32; benchmarks/step_profile.py, one replica, STEPS default 20, the
# embedded synthetic shapes unless DATA_DIR). Rows to $OUT/host_time_fig4.jsonl, $OUT/stack_<label>.jsonl and
# $OUT/step_profile.jsonl (key `library`: old or new); the new library is in place again at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
lib=tf_sparseconv/_tf_sparseconv_ops.so
old_lib=${OLD_LIB:-.altlib/_tf_sparseconv_ops.so}
# Without the old library both labels would run the new one (.altlib is git-ignored: carry it).
[ -f "$old_lib" ] || { echo "no old op library at $old_lib (carry .altlib, or set OLD_LIB)" >&2; exit 1; }
cp "$lib" /tmp/new_ops.so || exit 1
cp "$old_lib" /tmp/old_ops.so || exit 1
quiet() { grep -v "^W0000\|^I0000\|^WARNING: All log"; }
data=()
[ -n "${DATA_DIR:-}" ] && data=(--data-dir "$DATA_DIR")
failed=0
dense=--dense
for round in $(seq "${ROUNDS:-2}"); do
  for label in old new; do
    cp "/tmp/${label}_ops.so" "$lib"
    echo "== round $round, $label"
    if [ "${FIG4:-1}" = 1 ]; then
      # shellcheck disable=SC2086  # word lists on purpose
      python3 dev/host_time_fig4.py --resolutions ${RESOLUTIONS:-128 256} --selections none signed \
        --label "$label" $dense 2>&1 | quiet
      [ "${PIPESTATUS[0]}" = 0 ] || { echo "Fig. 4 layer with $label failed"; failed=1; }
    fi
    if [ "${STACK:-1}" = 1 ]; then
      # shellcheck disable=SC2086
      python3 benchmarks/direct_conv_stack_gpu.py --resolutions ${STACK_RESOLUTIONS:-256} --filter-densities 0.1 \
        --out "$out/stack_$label.jsonl" 2>&1 | quiet | tail -4
      [ "${PIPESTATUS[0]}" = 0 ] || { echo "stack with $label failed"; failed=1; }
    fi
    if [ "${STEP:-0}" = 1 ]; then
      python3 benchmarks/step_profile.py --replicas 1 --steps "${STEPS:-20}" --resolution "${STEP_RESOLUTION:-32}" \
        "${data[@]}" \
        --out "/tmp/step_$label.jsonl" 2>&1 | quiet | tail -3
      [ "${PIPESTATUS[0]}" = 0 ] || { echo "step with $label failed"; failed=1; }
      tail -1 "/tmp/step_$label.jsonl" |
        python3 -c "import json,sys; r=json.load(sys.stdin); r['library']='$label'; print(json.dumps(r))" \
        >> "$out/step_profile.jsonl"
    fi
  done
  dense=
done
cp /tmp/new_ops.so "$lib"
exit $failed
