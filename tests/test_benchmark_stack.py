"""benchmarks/gpu_trace.py's reading of a profiler trace (time and launches per
kernel name, busy time as the union of the GPUs' stream events) on a hand-built XSpace, and
one small CPU run whose rows of each kind carry their keys."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_trace  # noqa: E402
from tests.test_benchmark_step_profile import add_event, trace_with_one_gpu  # noqa: E402


def test_kernels_in_trace_ranks_names_by_time_per_call(tmp_path):
    space, gpu = trace_with_one_gpu(["ContributionsKernel", "SortKernel", "Memset"])
    stream = gpu.lines.add()
    stream.name, stream.timestamp_ns = "Stream #7(Compute,Memset)", 0
    add_event(stream, 1, 0, 3000)
    add_event(stream, 2, 3000, 5000)
    add_event(stream, 1, 10000, 3000)
    add_event(stream, 3, 9000, 2000)          # overlaps the second ContributionsKernel by 1000
    derived = gpu.lines.add()
    derived.name = "TensorFlow Ops"        # repeats the streams' time: left out
    add_event(derived, 2, 0, 10**6)
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(space.SerializeToString())
    busy_ms, top = gpu_trace.kernels_in_trace(str(path), calls=2, top=2)
    assert busy_ms == pytest.approx((8000 + 4000) / 1e9 / 2)  # [0, 8000) and [9000, 13000)
    assert [name for name, _, _ in top] == ["ContributionsKernel", "SortKernel"]  # 6000 and 5000 ps
    assert top[0][1] == pytest.approx(6000 / 1e9 / 2) and top[0][2] == 1.0
    assert top[1][2] == 0.5


def test_a_small_cpu_run_writes_each_kind_of_row(tmp_path):
    out = tmp_path / "stack.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "benchmarks/direct_conv_stack_gpu.py", "--device", "/CPU:0",
                           "--resolutions", "16", "--filter-densities", "0.5", "--warmup", "1", "--repeats", "2",
                           "--per-layer", "--kernels", "3", "--dataflow", "sort", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds == ["stack"] + ["stack_layer"] * 6 + ["stack_kernels"]
    assert all(r["dataflow"] == "sort" and r["r"] == 16 for r in rows)
    assert rows[0]["ours_s"] > 0 and rows[0]["dense_s"] > 0 and rows[0]["ratio"] > 0
    layers = ["1: conv 1->8", "2: conv 8->8", "3: max-pool 2", "4: conv 8->16", "5: conv 16->16", "6: max-pool 2"]
    assert [r["layer"] for r in rows[1:7]] == layers
    assert all(r["in_entries"] > 0 and r["out_length"] > 0 for r in rows[1:7])
    assert rows[7]["gpu_busy_s"] == 0 and rows[7]["kernels"] == []  # no GPU here: no GPU plane
    assert "summary: 1 stack rows" in done.stdout
