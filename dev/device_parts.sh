#!/usr/bin/env bash
# Packs what one lease on the lent GPU needs into as few device calls as the 64 MiB carry
# limit allows: the TensorFlow-GPU bundle (built once by ../shared/device/tf-gpu/make-bundle.sh),
# spconv's wheels if ../shared/peers/make-spconv-bundle.sh has laid them out in .peers/, this
# checkout's op library (debug info stripped), the tests' hypothesis (from .venv) and the
# device-side setup scripts, as one tar split into pieces under .devparts/c1 .. cN, each as
# large as the 64 MiB a call carries leaves beside the working tree (tracked files, 4 MB spare)
# (git-ignored). DEVPARTS_PEERS=0 leaves spconv out (training runs do not need it);
# DEVPARTS_DATA names the data files to take. DEVPARTS_LIB=DIR takes the op library
# (_tf_sparseconv_ops.so and _build_info.py) from DIR, e.g. a CUDA build in another worktree,
# instead of tf_sparseconv/: no need to swap the checkout's CPU library out and back (a plain
# `cp` over a loaded library rewrites it in place, and a test run using it dies of SIGBUS).
# 8 calls instead of 11 for TensorFlow, spconv and the library (seen 2026-11-23: about 4 s
# per piece on an H200).
#
# The tracked kept models would fill a call's 64 MiB: `bash dev/device_slim_tree.sh on` first
# (and `off` after the lease). Then, in one lease, back to back: for k = 1 .. N-1, `run` with
#   command: mkdir -p /tmp/blob && cp .devparts/ck/* /tmp/blob/     carry: [".devparts/ck"]
# and last, carrying .devparts/cN:
#   command: bash dev/device_unpack.sh && . /tmp/tfgpu.env && ...
# (device_unpack.sh sources neither env file itself; add `. /tmp/peers.env` where spconv is used.)
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
tfgpu="${TFGPU_BUNDLE:-$HOME/.cache/tfgpu-bundle-2.21.0/bundle.tar.xz}"
[ -s "$tfgpu" ] || { echo "no TensorFlow-GPU bundle at $tfgpu: run ../shared/device/tf-gpu/make-bundle.sh first" >&2; exit 1; }
lib="${DEVPARTS_LIB:-tf_sparseconv}"
[ -f "$lib/_tf_sparseconv_ops.so" ] || { echo "no op library in $lib: build it first (setup.py build_ext --inplace)" >&2; exit 1; }
grep -q "CUDA = True" "$lib/_build_info.py" || { echo "the op library in $lib has no GPU kernels" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tfp" "$stage/devpack/lib"
split -b 60000000 -d -a 2 "$tfgpu" "$stage/tfp/part"
cp ../shared/device/tf-gpu/setup-on-device.sh "$stage/devpack/"
if [ "${DEVPARTS_PEERS:-1}" = 1 ] && ls .peers/p*/*.whl* > /dev/null 2>&1; then
  mkdir -p "$stage/peerparts"
  cp .peers/p*/*.whl* "$stage/peerparts/"
  cp ../shared/peers/install-on-device.sh "$stage/devpack/"
fi
cp "$lib/_tf_sparseconv_ops.so" "$lib/_build_info.py" "$stage/devpack/lib/"
# The commit the benchmarks' rows name (the lent machine gets the tree without its history).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.devparts' || echo -dirty)" > "$stage/devpack/commit"
# Data files of ../shared/data for .devdata/ on the device: by default the LiDAR frame of
# the benchmarks' lidar scenes (benchmarks/site_scenes.py reads .devdata/); training runs
# name e.g. DEVPARTS_DATA="modelnet40_train.npz" and read it with --data-dir .devdata.
for name in ${DEVPARTS_DATA:-lidar_scan.npz}; do
  if [ -f "../shared/data/$name" ]; then
    mkdir -p "$stage/devpack/data" && cp "../shared/data/$name" "$stage/devpack/data/"
  fi
done
strip -g "$stage/devpack/lib/_tf_sparseconv_ops.so"
# The tests' dependency the device lacks (tests/*/test_fuzz.py): hypothesis and
# sortedcontainers, unpacked from pure-Python wheels with their dist-info (so that pytest
# loads hypothesis' plugin). Not .venv's copy: hypothesis from 6.141 on ships a compiled
# module built for .venv's Python, and the device runs another Python.
mkdir -p "$stage/devpack/pylib" "$stage/wheels"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: \
  -d "$stage/wheels" "hypothesis>=6.100,<6.141" sortedcontainers
for wheel in "$stage"/wheels/*.whl; do
  .venv/bin/python -m zipfile -e "$wheel" "$stage/devpack/pylib/"
done
rm -rf "$stage/wheels"
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")" && touch "$exclude"
grep -qx '/.devparts/' "$exclude" || echo '/.devparts/' >> "$exclude"
rm -rf .devparts && mkdir -p .devparts
# A call carries the working tree too (27.5 MB since the kept ModelNet40 models, 2026-11-28).
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
piece=$(( 64 * 1024 * 1024 - tree - 4000000 ))
[ "$piece" -gt 10000000 ] || { echo "the working tree ($tree bytes) leaves no room for pieces" >&2; exit 1; }
(cd "$stage" && tar -cf - *) | split -b "$piece" -d -a 2 - "$stage/blob."
n=0
for piece in "$stage"/blob.*; do
  n=$((n + 1)); mkdir -p ".devparts/c$n"; mv "$piece" ".devparts/c$n/"
done
du -sh .devparts/c* | sed "s|$here/||"
echo "$n pieces: $((n - 1)) copy calls, then the work call carrying .devparts/c$n"
