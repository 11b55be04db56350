"""Where the time of the Fig. 4 layer as inside a network goes (a diagnostic for the lent GPU):
benchmarks/direct_conv_gpu.py's unrolled function of CALLS padded convolutions, per convolution
(T(CALLS) - T(1)) / (CALLS - 1) as the benchmark's `ours_unrolled_gpu_s`, then a profiler trace
of it: the GPU's busy time and its stream events (launches, copies, memsets) per convolution,
and with --host-events the host planes' events grouped by name (count and microseconds per
convolution; CUPTI's launch calls show there by kernel name). Rows (with --label, e.g. the op
library's build) appended to $OUT/host_time_fig4.jsonl.

    python3 dev/host_time_fig4.py --resolutions 128 256 --label new
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import tensorflow as tf  # noqa: E402

import tf_sparseconv as ts  # noqa: E402

import direct_conv_gpu as fig4  # noqa: E402
from gpu_trace import gpu_stream_events, idle_gaps, read_xspace, trace_file, union_length  # noqa: E402


def host_events(space, calls, top, group=lambda name: name, per=1e6):
    """{plane | line: [(name, count per call, time per call)]} of the non-GPU planes, `top` names
    each, the events grouped by group(name); the time in microseconds (per=1e6 picoseconds),
    or milliseconds with per=1e9."""
    out = {}
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            by_name = {}
            for e in line.events:
                name = group(names.get(e.metadata_id, "?"))
                count, ps = by_name.get(name, (0, 0))
                by_name[name] = (count + 1, ps + e.duration_ps)
            ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
            if ranked:
                out[f"{plane.name} | {line.name}"] = [(n[:140], c / calls, ps / per / calls) for n, (c, ps) in ranked]
    return out


def gap_summary(events, calls):
    """Idle time between consecutive GPU events (the holes of their union), per call in
    microseconds: the total, and how much of it lies in holes under 2, 2-5, 5-20 and over 20 us."""
    holes = [h / 1e6 for h in idle_gaps([(b, e) for b, e, _ in events], 1)]
    bins = {"total": sum(holes)}
    for name, lo, hi in (("lt2", 0, 2), ("2to5", 2, 5), ("5to20", 5, 20), ("ge20", 20, float("inf"))):
        bins[name] = sum(h for h in holes if lo <= h < hi)
    return {k: round(v / calls, 2) for k, v in bins.items()}


def print_timeline(events, count):
    """count consecutive events from the middle of the trace: gap before it, duration (us), name."""
    events = sorted(events)
    start = max(0, len(events) // 2 - count // 2)
    end = None
    for b, e, name in events[start:start + count]:
        gap = 0.0 if end is None else (b - end) / 1e6
        print(f"     gap {gap:7.2f}  dur {(e - b) / 1e6:7.2f}  {name[:90]}", flush=True)
        end = e if end is None else max(end, e)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--selections", nargs="+", default=["none"], choices=fig4.SELECTIONS)
    parser.add_argument("--rho-f", type=float, default=0.1)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--traced-calls", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--host-events", action="store_true")
    parser.add_argument("--timeline", type=int, default=0,
                        help="print this many consecutive GPU events from the trace's middle, "
                        "each with the idle gap before it")
    parser.add_argument("--dataflow", default="auto")
    parser.add_argument("--label", default="")
    parser.add_argument("--dense", action="store_true", help="also cuDNN's conv3d per call the same way")
    args = parser.parse_args()
    out = os.path.join(os.environ.get("OUT", "/tmp"), "host_time_fig4.jsonl")
    for r in args.resolutions:
        x, w, mask, bias = fig4.make_inputs(fig4.config_rng(0, 1, r, args.rho_f), 1, r, args.rho_f)
        if args.dense:
            dense = ts.to_dense(x)
            w_masked = w * tf.cast(mask, w.dtype)
            dense_us = fig4.unrolled_s_per_call(*fig4.dense_fns(dense, w_masked), args.calls, 3, args.repeats) * 1e6
            print(f"== {args.label} r={r} cuDNN conv3d: {dense_us:.1f} us per call", flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(dict(label=args.label, r=r, rho_f=args.rho_f, dense_per_call_us=dense_us)) + "\n")
            del dense
        for selection in args.selections:
            conv_once, prepare = fig4.padded_sparse_fns(x, w, mask, bias, selection, r, args.dataflow)
            per_call_us = fig4.unrolled_s_per_call(conv_once, prepare, args.calls, 3, args.repeats) * 1e6
            many = fig4.unrolled_fns(conv_once, args.calls)[1]
            space = read_xspace(trace_file(many, (prepare,), args.traced_calls))
            convs = args.traced_calls * args.calls
            gpu = [ev for _, (_, events) in gpu_stream_events(space).items() for ev in events]
            busy_us = union_length([(b, e) for b, e, _ in gpu]) / 1e6 / convs
            row = dict(label=args.label, r=r, rho_f=args.rho_f, selection=selection, dataflow=args.dataflow,
                       per_call_us=per_call_us, gpu_busy_us=busy_us, gpu_events=len(gpu) / convs)
            print(f"== {args.label} r={r} {selection}: {per_call_us:.1f} us per call, GPU busy {busy_us:.1f} us, "
                  f"{len(gpu) / convs:.1f} stream events per call", flush=True)
            row["gaps_us"] = gap_summary(gpu, convs)
            print(f"   idle between events: {row['gaps_us']}", flush=True)
            if args.timeline:
                print_timeline(gpu, args.timeline)
            if args.host_events:
                row["host"] = host_events(space, convs, args.top)
                for line, ranked in row["host"].items():
                    print(f"  -- {line}")
                    for name, count, us in ranked:
                        print(f"     {us:9.2f} us {count:7.2f}x  {name}")
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
