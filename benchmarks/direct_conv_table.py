"""Markdown tables of a direct_conv_gpu.jsonl file (time: synchronised call and device time
per call; memory: peak above the inputs), as in the README.

    python benchmarks/direct_conv_table.py [benchmarks/results/direct_conv_gpu.jsonl]
"""
import json
import os
import sys

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "direct_conv_gpu.jsonl")


def ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def ratio(x):
    return "-" if x is None else f"{x:.2f}"


def gib(b):
    return "does not fit" if b is None else f"{b / 2 ** 30:.3f}"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| r³ | ρ_f | k-selection | ours call [ms] | cuDNN call [ms] | dense/ours | ours device [ms] "
          "| cuDNN device [ms] | dense/ours (device) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("kind") == "time":
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {ms(r['ours_s'])} | {ms(r['dense_s'])} "
                  f"| {ratio(r['ratio'])} | {ms(r.get('ours_gpu_s'))} | {ms(r.get('dense_gpu_s'))} "
                  f"| {ratio(r.get('ratio_gpu'))} |")
    print()
    print("| r³ (batch 32) | ρ_f | k-selection | ours peak [GiB] | dense peak [GiB] |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        if r.get("kind") == "memory" and "temp_limit_mb" not in r:
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {gib(r['ours_peak_bytes'])} "
                  f"| {gib(r['dense_peak_bytes'])} |")
    # --memory-only rows (no dense baseline): the peak split as Table 1 does, and the call time.
    limited = [r for r in rows if r.get("kind") == "memory" and "temp_limit_mb" in r]
    if limited:
        print()
        print("| r³ (batch 32) | ρ_f | k-selection | temp limit [MiB] | ours call [ms] | peak [GiB] "
              "| of it output [GiB] | of it temporary [GiB] |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in limited:
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {r['temp_limit_mb'] or 'none'} "
                  f"| {ms(r['ours_s'])} | {gib(r['ours_peak_bytes'])} | {gib(r.get('out_bytes'))} "
                  f"| {gib(r.get('temp_bytes'))} |")
    for r in rows:
        if r.get("kind") == "epoch":
            print(f"\nepoch at {r['resolution']}³ on {r['device']}: {r['sec_per_epoch']:.1f} s")


if __name__ == "__main__":
    main()
