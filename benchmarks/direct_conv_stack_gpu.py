"""A six-layer stack of direct sparse convolutions against the same stack of cuDNN's dense
conv3d, each as one whole tf.function call (issue 24's `stack` rows).

The stack, as OctNet3's blocks (Hackel et al., Table 4): conv 1 -> 8 (ReLU), conv 8 -> 8
(ReLU), max-pool 2, conv 8 -> 16 (ReLU), conv 16 -> 16 (ReLU), max-pool 2, then the dense
result [B, r/4, r/4, r/4, 16] (to_dense ends the sparse part). Input: the Fig. 4 grid of
benchmarks/direct_conv_gpu.py (batch 1, r^2 random entries of an r^3 grid, rho = 1/r), 3^3
filters with a random mask of exactly rho_f of their weights; every sparse convolution keeps at most
k = ceil(rho_up * cells) entries per channel ('signed', rho_up = 1/r of its own grid, the
density of the input). The dense stack runs tf.nn.conv3d with the masked filters, ReLU and
tf.nn.max_pool3d on the dense input.

ours_s / dense_s: medians of synchronised whole calls after warm-up, in the same process
(ratio = dense_s / ours_s); ours with the padded outputs of issue 24 (`padded`: True, the
library's default in traced functions for OctNet3) and with exact outputs (`padded`: False).
Rows (kind "stack") are appended to benchmarks/results/direct_conv_gpu.jsonl (--out).

    python benchmarks/direct_conv_stack_gpu.py [--resolutions 64 128 256] [--out PATH]
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_sparseconv as ts  # noqa: E402
from direct_conv_gpu import config_rng, filter_mask, random_keys  # noqa: E402
from gpu_trace import kernel_times  # noqa: E402
from run_info import checkout_commit  # noqa: E402
from timing import median_time  # noqa: E402

CHANNELS = ((1, 8), (8, 8), "pool", (8, 16), (16, 16), "pool")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "direct_conv_gpu.jsonl")


def make_stack(rng, r, rho_f, device):
    """The input tensor and the filters and masks of the stack's four convolutions."""
    keys = random_keys(rng, 1, r)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(rng.standard_normal(len(keys)).astype(np.float32)),
                                   tf.constant([1, r, r, r, 1], tf.int64))
        filters = []
        for cin, cout in (c for c in CHANNELS if c != "pool"):
            w = rng.standard_normal((3, 3, 3, cin, cout)) * (2.0 / (27 * cin)) ** 0.5  # He
            filters.append((tf.constant(w.astype(np.float32)), tf.constant(filter_mask(rng, w.shape, rho_f))))
    return x, filters


def sparse_stack(r, filters, padded, dataflow="auto"):
    @tf.function
    def run(keys, values, dense_shape):
        h = ts.ChannelSparseTensor(keys, values, dense_shape)
        convs = iter(filters)
        for layer in CHANNELS:
            if layer == "pool":
                h = ts.sparse_max_pool(h, 2, padded_output=padded)
            else:
                w, mask = next(convs)
                h = ts.direct_conv(h, w, None, mask, selection="signed", rho_up=1.0 / r, activation="relu",
                                   padded_output=padded, dataflow=dataflow)
        return ts.to_dense(h)
    return run


def layer_times(x, r, filters, warmup, repeats, dataflow="auto"):
    """(name, seconds, input entries, output length) of each sparse layer alone, padded
    outputs, on the previous layer's output (synchronised calls, as the whole stack)."""
    out, convs, h = [], iter(filters), x
    for i, layer in enumerate(CHANNELS):
        if layer == "pool":
            name, fn = f"{i + 1}: max-pool 2", tf.function(lambda k, v, s, p: ts.sparse_max_pool(
                ts.ChannelSparseTensor(k, v, s, padded=p), 2, padded_output=True))
        else:
            w, mask = next(convs)
            name = f"{i + 1}: conv {layer[0]}->{layer[1]}"
            fn = tf.function(lambda k, v, s, p, w=w, mask=mask: ts.direct_conv(
                ts.ChannelSparseTensor(k, v, s, padded=p), w, None, mask, selection="signed", rho_up=1.0 / r,
                activation="relu", padded_output=True, dataflow=dataflow))
        args = (h.keys, h.values, h.dense_shape, h.padded)
        seconds = median_time(lambda: fn(*args), warmup, repeats)
        y = fn(*args)
        out.append((name, seconds, int(h.live_entries), int(y.num_entries)))
        h = ts.ChannelSparseTensor(y.keys, y.values, y.dense_shape, padded=True)
    return out


def dense_stack(filters):
    masked = [w * tf.cast(mask, w.dtype) for w, mask in filters]

    @tf.function
    def run(dense):
        h, convs = dense, iter(masked)
        for layer in CHANNELS:
            if layer == "pool":
                h = tf.nn.max_pool3d(h, 2, 2, "VALID")
            else:
                h = tf.nn.relu(tf.nn.conv3d(h, next(convs), strides=[1] * 5, padding="SAME"))
        return h
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--filter-densities", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    p.add_argument("--device", default="/GPU:0")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-layer", action="store_true", help="also time each sparse layer alone (kind stack_layer)")
    p.add_argument("--dataflow", choices=("auto", "sort", "dense", "bitmap", "atomic"), default="auto",
                   help="the convolutions' dataflow (direct_conv's dataflow=)")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also trace 3 calls of the padded stack and give its N costliest GPU kernels (kind "
                        "stack_kernels: the GPU's busy time per call and each kernel's time and launches per call)")
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args()
    gpus = tf.config.list_physical_devices("GPU")
    device_name = (tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
                   if gpus and "GPU" in args.device.upper() else "cpu")
    configs = [(r, rho_f) for r in args.resolutions for rho_f in args.filter_densities]
    started, rows = time.time(), []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for i, (r, rho_f) in enumerate(configs, 1):
        x, filters = make_stack(config_rng(args.seed, r, rho_f), r, rho_f, args.device)
        with tf.device(args.device):
            dense_in = ts.to_dense(x)
            dense = dense_stack(filters)
            want = dense(dense_in).numpy()
            row = dict(kind="stack", r=r, rho=1.0 / r, rho_f=rho_f, batch=1, layers=len(CHANNELS),
                       entries=int(x.keys.shape[0]), dataflow=args.dataflow, device=device_name,
                       date=datetime.date.today().isoformat(),
                       commit=checkout_commit(),
                       dense_s=median_time(lambda: dense(dense_in), args.warmup, args.repeats))
            for padded in (True, False):
                ours = sparse_stack(r, filters, padded, args.dataflow)
                got = ours(x.keys, x.values, x.dense_shape).numpy()
                # k-selection keeps the k largest per channel and the support stays the
                # touched set: the sparse stack is not the dense one, so only the shape is checked
                assert got.shape == want.shape, (got.shape, want.shape)
                seconds = median_time(lambda: ours(x.keys, x.values, x.dense_shape), args.warmup, args.repeats)
                key = "ours_s" if padded else "ours_exact_s"
                row[key] = seconds
            row["ratio"] = row["dense_s"] / row["ours_s"]
            row["ratio_exact"] = row["dense_s"] / row["ours_exact_s"]
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
            if args.per_layer:
                with tf.device(args.device):
                    timed = layer_times(x, r, filters, args.warmup, args.repeats, args.dataflow)
                for name, seconds, entries, length in timed:
                    f.write(json.dumps(dict(kind="stack_layer", r=r, rho_f=rho_f, layer=name, ours_s=seconds,
                                            in_entries=entries, out_length=length, dataflow=args.dataflow,
                                            device=device_name, date=row["date"], commit=row["commit"])) + "\n")
                    print(f"    {name}: {seconds * 1e3:.2f} ms ({entries} live entries in, {length} out)", flush=True)
            if args.kernels:
                with tf.device(args.device):
                    busy, top = kernel_times(sparse_stack(r, filters, True, args.dataflow),
                                             (x.keys, x.values, x.dense_shape), 3, args.kernels)
                f.write(json.dumps(dict(kind="stack_kernels", r=r, rho_f=rho_f, dataflow=args.dataflow,
                                        gpu_busy_s=busy / 1e3, kernels=[[n, ms / 1e3, c] for n, ms, c in top],
                                        device=device_name, date=row["date"], commit=row["commit"])) + "\n")
                print(f"    GPU busy {busy:.2f} ms per call; costliest kernels:", flush=True)
                for name, ms, count in top:
                    print(f"      {ms:7.3f} ms  x{count:5.1f}  {name[:110]}", flush=True)
        print(f"[{i}/{len(configs)}] r={r} rho_f={rho_f}: ours {row['ours_s'] * 1e3:.2f} ms (exact outputs "
              f"{row['ours_exact_s'] * 1e3:.2f} ms), dense {row['dense_s'] * 1e3:.2f} ms: {row['ratio']:.2f}x "
              f"({row['ratio_exact']:.2f}x)", flush=True)
    print(f"summary: {len(rows)} stack rows in {time.time() - started:.0f} s on {device_name}; best "
          f"{max(r['ratio'] for r in rows):.2f}x; appended to {args.out}")


if __name__ == "__main__":
    main()
