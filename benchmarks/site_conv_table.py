"""Markdown tables and win counts from a merged site_conv_gpu.jsonl (benchmarks/site_conv_gpu.py
--phase merge): device time per call (ours: graph loop; spconv: CUDA events) and the
synchronised call from Python, ours against spconv in the same run.

  python benchmarks/site_conv_table.py benchmarks/results/site_conv_gpu.jsonl [--scenes lidar_5cm ...]
"""
import argparse
import json
from collections import defaultdict


def ms(value):
    return f"{value * 1e3:.3f}" if isinstance(value, (int, float)) else "—"


def ratio(num, den):
    return f"{num / den:.2f}" if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den else "—"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--scenes", nargs="*", default=None, help="layer rows of these scenes (all: every scene)")
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.results)]
    overhead = next((r["ours_s"] for r in rows if r.get("pass") == "overhead"), None)
    if overhead is not None:
        print(f"A synchronised tf.function call of one tiny GPU op in this run: {overhead * 1e3:.3f} ms\n")
    print("| scene | layer | pass | dtype | dataflow | pairs | ours device ms | spconv device ms | spconv / ours (device) "
          "| ours call ms | spconv call ms | floor ms |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    wins = defaultdict(lambda: [0, 0, 0])  # (dtype, dataflow) -> [device wins, call wins, compared]
    for r in rows:
        if r.get("pass") in ("map", "overhead") or r.get("spconv_gpu_s") is None:
            continue
        counts = wins[r["dtype"], r.get("dataflow", "pairs")]
        counts[0] += r["ours_gpu_s"] <= r["spconv_gpu_s"]
        counts[1] += r["ours_s"] <= r["spconv_s"]
        counts[2] += 1
        if r["layer"] != "end_to_end" and args.scenes is not None and r["scene"] not in args.scenes:
            continue
        print(f"| {r['scene']} | {r['layer']} | {r['pass']} | {r['dtype']} | {r.get('dataflow', 'pairs')} "
              f"| {r.get('pairs') or ''} "
              f"| {ms(r['ours_gpu_s'])} | {ms(r['spconv_gpu_s'])} | {ratio(r['spconv_gpu_s'], r['ours_gpu_s'])} "
              f"| {ms(r['ours_s'])} | {ms(r['spconv_s'])} | {ms(r.get('floor_s'))} |")
    print()
    for (dtype, dataflow), (device, call, total) in wins.items():
        print(f"- {dtype} ({dataflow}): ours at least as fast in device time in {device} of {total} configurations, "
              f"per synchronised call in {call} of {total}")


if __name__ == "__main__":
    main()
