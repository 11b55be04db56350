"""What a user-given max_entries buys padded convolutions without k-selection (issue 24).

A padded DirectSparseConv allocates a length known before it runs. Without k-selection that
is the proven bound: B * Cout * S, capped by the input's length times the present weights of
an input channel. A padded input counts with its whole length, so the bounds compound along a
chain of layers, while a surface's touched set grows by a few voxels per layer. On ModelNet40
shapes (../shared/data/modelnet40_train.npz) voxelized at each --resolution, in batches of
--batch, a chain of two 3^3 convolutions as OctNet3's first block has them (1 -> 8 -> 8
channels, every weight present, ReLU fused, no k-selection), padded:

  bound    the padded lengths without a cap (the op's own, the outputs' lengths);
  cap      what a user would give as max_entries: the largest live count of --calibrate
           batches times --margin, per layer;
  held-out other batches run with those caps: their live counts, how many exceed each
           layer's cap (the capped chain refuses those batches: InvalidArgument, the output
           has more entries than max_entries; the run stops if one is not refused), and the
           padded lengths and bytes (an 8-byte key and a 4-byte value per slot) with and
           without caps.

The counts do not depend on the device; this runs where TensorFlow puts it (the CPU here).
One JSON object per line in --out (default results/conv_capacity.jsonl), which a run replaces
only with --replace.

    python benchmarks/conv_capacity.py --resolutions 32 64 [--data-dir ../shared/data]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tf_sparseconv as ts  # noqa: E402
from tf_sparseconv.data.modelnet import load_modelnet_npz  # noqa: E402
from tf_sparseconv.data.voxelize import voxelize_arrays  # noqa: E402
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402
from run_info import checkout_commit  # noqa: E402

SLOT_BYTES = 8 + 4  # int64 key, float32 value
CHANNELS = (1, 8, 8)  # OctNet3's first block: occupancy -> 8 -> 8


def chain(x, filters, caps):
    """The padded chain's outputs (ChannelSparseTensors), each layer capped by caps[i] (None: no cap)."""
    outputs = []
    for w, cap in zip(filters, caps):
        x = ts.direct_conv(x, w, activation="relu", padded_output=True, max_entries=cap)
        outputs.append(x)
    return outputs


def batches(points, order, batch, resolution):
    for start in range(0, len(order) - batch + 1, batch):
        keys, values, dense_shape = voxelize_arrays(points[order[start:start + batch]], resolution)
        yield ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[32, 64])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--calibrate", type=int, default=10, help="batches whose largest live count sets the caps")
    p.add_argument("--held-out", type=int, default=20, help="other batches run with the caps")
    p.add_argument("--margin", type=float, default=1.25, help="cap = margin x the calibration batches' largest count")
    p.add_argument("--data-dir", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "conv_capacity.jsonl"))
    add_replace_argument(p)
    args = p.parse_args()
    if args.margin < 1.0 or args.calibrate < 1 or args.held_out < 1 or args.batch < 1:
        p.error("--margin must be >= 1 and --calibrate, --held-out and --batch >= 1")
    refuse_to_replace(p, args.out, args.replace)
    path = os.path.join(args.data_dir, "modelnet40_train.npz")
    if not os.path.isfile(path):
        p.error(f"{path} does not exist (give --data-dir, the folder of modelnet40_train.npz)")
    points, _, _ = load_modelnet_npz(path)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(points))
    calibration = order[:args.calibrate * args.batch]
    held_out = order[args.calibrate * args.batch:(args.calibrate + args.held_out) * args.batch]
    filters = [tf.constant(rng.standard_normal((3, 3, 3, cin, cout)).astype(np.float32) / math.sqrt(27 * cin))
               for cin, cout in zip(CHANNELS, CHANNELS[1:])]
    rows = []
    for resolution in args.resolutions:
        started = time.perf_counter()
        live_seen = [[] for _ in filters]
        for i, x in enumerate(batches(points, calibration, args.batch, resolution)):
            for seen, y in zip(live_seen, chain(x, filters, [None] * len(filters))):
                seen.append(int(y.live_entries))
            print(f"\r[{resolution}^3] calibration batch {i + 1}/{args.calibrate}", end="", flush=True)
        caps = [math.ceil(max(seen) * args.margin) for seen in live_seen]
        stats = [{"in": [], "bound": [], "live": [], "capped": [], "overflows": 0} for _ in filters]
        for i, x in enumerate(batches(points, held_out, args.batch, resolution)):
            bounded = chain(x, filters, [None] * len(filters))
            inputs = [int(x.num_entries)] + [int(y.num_entries) for y in bounded[:-1]]
            for s, n, y in zip(stats, inputs, bounded):
                s["in"].append(n)
                s["bound"].append(int(y.num_entries))
                s["live"].append(int(y.live_entries))
            over = [s["live"][-1] > cap for s, cap in zip(stats, caps)]
            for s, o in zip(stats, over):
                s["overflows"] += int(o)
            try:
                capped = chain(x, filters, caps)
            except tf.errors.InvalidArgumentError as e:
                if "more than max_entries" not in str(e) or not any(over):
                    raise
                continue
            if any(over):
                raise RuntimeError(f"a batch over a cap ({over}) was not refused")
            for s, y in zip(stats, capped):
                s["capped"].append(int(y.num_entries))
            print(f"\r[{resolution}^3] held-out batch {i + 1}/{args.held_out}  ", end="", flush=True)
        print(f"\r[{resolution}^3] {args.calibrate} + {args.held_out} batches of {args.batch} in "
              f"{time.perf_counter() - started:.0f} s")
        for layer, (s, cap) in enumerate(zip(stats, caps), 1):
            bound, capped = statistics.median(s["bound"]), statistics.median(s["capped"]) if s["capped"] else None
            row = {"kind": "capacity", "resolution": resolution, "batch": args.batch, "layer": layer,
                   "channels": [CHANNELS[layer - 1], CHANNELS[layer]], "held_out_batches": len(s["live"]),
                   "in_entries_median": statistics.median(s["in"]), "bound_median": bound,
                   "live_median": statistics.median(s["live"]), "live_max": max(s["live"]),
                   "cap": cap, "margin": args.margin, "calibration_batches": args.calibrate,
                   "capped_length_median": capped, "overflows": s["overflows"],
                   "bound_mb": bound * SLOT_BYTES / 2**20,
                   "cap_mb": None if capped is None else capped * SLOT_BYTES / 2**20,
                   "grid_entries": args.batch * CHANNELS[layer] * resolution ** 3,
                   "device": "cpu" if not tf.config.list_logical_devices("GPU") else "gpu",
                   "commit": checkout_commit(), "date": time.strftime("%Y-%m-%d")}
            rows.append(row)
            ratio = f"{bound / capped:.1f}x" if capped else "-"
            print(f"  layer {layer} {row['channels']}: input {row['in_entries_median']:,.0f}, bound "
                  f"{bound:,.0f} ({row['bound_mb']:.1f} MB), live median {row['live_median']:,.0f} max "
                  f"{row['live_max']:,}, cap {cap:,} -> padded length {ratio} shorter; "
                  f"{s['overflows']} of {len(s['live'])} held-out batches over it")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
