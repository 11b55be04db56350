#!/usr/bin/env bash
# On the lent GPU, in the last call of a lease (after the pieces of dev/device_parts.sh):
# unpacks (dev/device_unpack.sh), then runs the GPU suites a change to the kernels needs and
# writes each suite's summary lines to $OUT/tests.txt (a call's output keeps only its tail):
# the channel family (`tests/channel -m gpu`, without the fuzz module), the fuzz targets
# that FUZZ_K selects (default "conv") at FUZZ_EXAMPLES cases (default 200), and the site
# family with the host-sync and chained-launch tests, cut off after SITE_TIMEOUT seconds
# (default 240).
#   bash dev/device_gpu_tests.sh        # carry: [".devparts/cN"]
set -uo pipefail
cd "$(dirname "$0")/.."
bash dev/device_unpack.sh > /tmp/unpack.log 2>&1 || { tail -20 /tmp/unpack.log; exit 1; }
# shellcheck disable=SC1091
. /tmp/tfgpu.env
export PYTHONPATH=.:${PYTHONPATH:-} TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
out=${OUT:-/tmp/out}
mkdir -p "$out"
summary="$out/tests.txt"
pick() { grep -E "passed|failed|FAILED|[0-9] error" | grep -v "^I0000\|^W0000" | tail -12; }
echo "== tests/channel -m gpu" >> "$summary"
python3 -m pytest -q -n 12 -p no:randomly -p no:cacheprovider tests/channel -m gpu \
  --ignore=tests/channel/test_fuzz.py 2>&1 | pick >> "$summary"
echo "== tests/channel/test_fuzz.py -m gpu -k '${FUZZ_K:-conv}'" >> "$summary"
python3 -m pytest -q -p no:randomly -p no:cacheprovider tests/channel/test_fuzz.py -m gpu -k "${FUZZ_K:-conv}" \
  --fuzz-examples "${FUZZ_EXAMPLES:-200}" 2>&1 | pick >> "$summary"
echo "== tests/site tests/test_host_syncs.py tests/test_chained_launch.py -m gpu" >> "$summary"
timeout "${SITE_TIMEOUT:-240}" python3 -m pytest -q -n 12 -p no:randomly -p no:cacheprovider tests/site \
  tests/test_host_syncs.py tests/test_chained_launch.py -m gpu 2>&1 | pick >> "$summary"
cat "$summary"
