#!/usr/bin/env bash
# On the lent GPU, after dev/device_unpack.sh and `. /tmp/tfgpu.env`: OctNet3 32³'s training
# step (benchmarks/step_profile.py, one replica, the embedded synthetic shapes unless DATA_DIR)
# under two op libraries alternated ROUNDS times (default 2): OLD_LIB (default
# .altlib/_tf_sparseconv_ops.so) and the unpacked one ("new"). Rows to $OUT/step_profile.jsonl
# (key `library`: old or new); the new library is in place again at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
lib=tf_sparseconv/_tf_sparseconv_ops.so
cp "$lib" /tmp/new_ops.so
cp "${OLD_LIB:-.altlib/_tf_sparseconv_ops.so}" /tmp/old_ops.so
data=()
[ -n "${DATA_DIR:-}" ] && data=(--data-dir "$DATA_DIR")
failed=0
for round in $(seq "${ROUNDS:-2}"); do
  for label in old new; do
    cp "/tmp/${label}_ops.so" "$lib"
    echo "== round $round, $label"
    python3 benchmarks/step_profile.py --replicas 1 --steps "${STEPS:-20}" "${data[@]}" \
      --out "/tmp/step_$label.jsonl" 2>&1 | grep -v "^W0000\|^I0000\|^WARNING: All log" | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "step with $label failed"; failed=1; }
    tail -1 "/tmp/step_$label.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); r['library']='$label'; print(json.dumps(r))" >> "$out/step_profile.jsonl"
  done
done
cp /tmp/new_ops.so "$lib"
exit $failed
