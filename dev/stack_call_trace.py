"""Where the six-layer stack's whole call (benchmarks/direct_conv_stack_gpu.py) spends the time
its GPU is not busy: the stack timed and traced with its inputs placed three ways, since the
convolution reads its filter mask in host memory and the user's keys are checked on the host
where they enter a traced function (direct_conv.check_on_host):
  gpu:        keys, values and masks on the GPU (the benchmark's placement);
  host_masks: the masks on the host (as the Keras layer keeps them), keys on the GPU;
  host_input: the masks and the keys on the host (as a tf.data batch arrives).
Per variant: the median of synchronised whole calls (interleaved rounds), then three traced
calls: the GPU's busy time, its first work after the call began, and the longest idle
stretches with the GPU events around them.
Rows (one per placement) are appended to benchmarks/results/stack_call_trace.jsonl (--out).
    python3 dev/stack_call_trace.py [--r 256] [--rounds 3] [--reps 7] [--out PATH]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import tf_sparseconv as ts  # noqa: E402
from direct_conv_stack_gpu import make_stack, sparse_stack  # noqa: E402
from gpu_trace import first_gpu_work, gpu_stream_events, named_gaps, python_calls, trace_file, union_length  # noqa
from run_info import checkout_commit  # noqa: E402
from timing import sync  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results",
                           "stack_call_trace.jsonl")


def placed(x, filters, variant):
    """The stack's input and filters with the variant's placement."""
    if variant == "gpu":
        return x, filters
    with tf.device("/CPU:0"):
        masks = [tf.identity(m) for _, m in filters]
        keys = tf.identity(x.keys) if variant == "host_input" else x.keys
    return ts.ChannelSparseTensor(keys, x.values, x.dense_shape), [(w, m) for (w, _), m in zip(filters, masks)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--r", type=int, default=256)
    p.add_argument("--rho-f", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    x, filters = make_stack(rng, args.r, args.rho_f, "/GPU:0")
    runs = {}
    for variant in ("gpu", "host_masks", "host_input"):
        xv, fv = placed(x, filters, variant)
        runs[variant] = (sparse_stack(args.r, fv, True), (xv.keys, xv.values, xv.dense_shape))
    ref = runs["gpu"][0](*runs["gpu"][1]).numpy()
    for variant, (run, feed) in runs.items():
        got = run(*feed).numpy()
        if not np.allclose(got, ref, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{variant} differs from gpu by {np.abs(got - ref).max()}")
    times = {v: [] for v in runs}
    for _ in range(args.rounds):
        for variant, (run, feed) in runs.items():
            for _ in range(2):
                run(*feed)
            sync()
            for _ in range(args.reps):
                start = time.perf_counter()
                run(*feed)
                sync()
                times[variant].append(time.perf_counter() - start)
    for variant, (run, feed) in runs.items():
        path = trace_file(lambda *a, run=run: (run(*a), sync()), feed, 3)
        events = [e for _, stream in gpu_stream_events(path).values() for e in stream]
        calls = python_calls(path, "run")
        busy = union_length([(b, e) for b, e, _ in events]) / 1e9 / 3
        first = [w / 1e9 for w in first_gpu_work(path, "run") if w is not None]
        walls = [(e - b) / 1e9 for b, e in calls]
        total, count, top = named_gaps(events, 20e6, 6)  # holes of at least 20 us
        print(f"{variant:10s} {statistics.median(times[variant]) * 1e3:6.2f} ms per call (median of "
              f"{len(times[variant])}); traced: calls {', '.join(f'{w:.2f}' for w in walls)} ms, GPU busy "
              f"{busy:.2f} ms a call, first GPU work {', '.join(f'{f:.3f}' for f in first)} ms after the "
              f"call began; idle stretches >= 20 us: {count / 3:.1f} a call, {total / 1e9 / 3:.2f} ms",
              flush=True)
        for length, before, after in top:
            print(f"    {length / 1e9:.3f} ms between {(before or '?')[:70]} and {(after or '?')[:70]}", flush=True)
        row = dict(kind="stack_call", r=args.r, rho_f=args.rho_f, placement=variant,
                   ours_s=statistics.median(times[variant]), traced_calls_s=[w / 1e3 for w in walls],
                   gpu_busy_s=busy / 1e3, first_gpu_work_s=[f / 1e3 for f in first],
                   idle_stretches_per_call=count / 3, idle_s_per_call=total / 1e12 / 3,
                   longest_idle=[[length / 1e12, before, after] for length, before, after in top],
                   device=tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
                   .get("device_name") if tf.config.list_physical_devices("GPU") else "cpu",
                   date=datetime.date.today().isoformat(), commit=checkout_commit())
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"summary: {len(runs)} placements of the {args.r}^3 stack; rows appended to {args.out}", flush=True)


if __name__ == "__main__":
    main()
